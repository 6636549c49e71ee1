"""/metrics carries each team's cost this month and its money budget (issue 50, point 4), the
figures metering computes (`metering.cost.team_month_cost`), running attempts up to the scrape."""

import datetime as dt
from decimal import Decimal

import pytest

from jobs.api.prometheus import render
from jobs.models import GpuPrice
from metering.cost import team_month_cost
from metering.prices import to_micros
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
NOW = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)


def samples(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("starforge_cost_month", "starforge_money_budget_month"))
    }


def test_the_months_cost_and_the_money_budget_per_team(team, alice, make_team, settings):
    settings.SF_CURRENCY = "EUR"
    GpuPrice.objects.create(
        cluster=team.default_cluster,
        per_gpu_hour=Decimal("2.5"),
        valid_from=NOW - dt.timedelta(days=9),
    )
    team.money_budget_per_month = Decimal("100")
    team.save()
    make_team("nlp")
    job = queued_job(team, alice, total_gpus=2)
    with_attempt(job, "RUNNING", start_time=NOW - dt.timedelta(hours=3))  # 6 GPU-h so far
    found = samples(render(NOW))
    assert found == {
        'starforge_cost_month{team="nlp",currency="EUR"}': 0.0,
        'starforge_cost_month{team="vision",currency="EUR"}': 15.0,
        'starforge_money_budget_month{team="vision",currency="EUR"}': 100.0,
    }
    assert team_month_cost(NOW) == {team.pk: to_micros("15")}
