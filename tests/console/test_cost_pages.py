"""The console shows cost where it shows GPU-hours (issue 50, point 4): the job page each
attempt's cost and, where the price changed while it ran, the prices it was billed at, and the
job's total; the jobs list a Cost column."""

import datetime as dt
from decimal import Decimal

import pytest
from django.test import Client

from jobs.models import GpuPrice
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
CHANGE = dt.datetime(2026, 11, 15, tzinfo=dt.UTC)


@pytest.fixture
def page(alice, team):
    for price, since in (("1.50", CHANGE - dt.timedelta(days=30)), ("2.50", CHANGE)):
        GpuPrice.objects.create(
            cluster=team.default_cluster, per_gpu_hour=Decimal(price), valid_from=since
        )
    client = Client()
    client.force_login(alice)
    return client


def test_the_job_page_says_where_an_attempt_was_billed_at_two_prices(page, team, alice):
    job = queued_job(team, alice, total_gpus=2, name="<b>x</b>")
    with_attempt(
        job,
        "SUCCEEDED",
        start_time=CHANGE - dt.timedelta(hours=1),
        end_time=CHANGE + dt.timedelta(hours=1),
    )
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert "cost 8.00 USD" in html  # 2 GPU-h at 1.50, 2 at 2.50
    assert "billed at 2 prices (the price changed while it ran): 1.50 per GPU-hour from " in html
    listed = page.get("/").content.decode()
    assert '<td class="cost mono">8.00 USD</td>' in listed
    assert "<b>x</b>" not in listed
