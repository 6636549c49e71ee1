"""Cost in usage answers (issue 50, point 4): the API, the page and the CSV give each row's cost
at the prices in force when it ran, recorded and running alike, and a member never sees another
team's cost."""

import csv
import datetime as dt
import io
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from jobs.models import GpuPrice
from metering.records import meter_ended
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
CHANGE = dt.datetime(2026, 11, 15, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def _frozen(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)


def ran(team, user, start, hours, total_gpus=1, running=False):
    job = queued_job(team, user, total_gpus=total_gpus)
    end = None if running else start + dt.timedelta(hours=hours)
    return with_attempt(job, "RUNNING" if running else "SUCCEEDED", start_time=start, end_time=end)


@pytest.fixture
def spent(team, alice, make_team, make_user):
    """vision: alice 2 GPU-h at 1.50 before the change (recorded), 1 GPU-h at 2.50 running now;
    nlp (another team, same cluster): carol 4 GPU-h at 2.50."""
    cluster = team.default_cluster
    for price, since in (("1.50", NOW - dt.timedelta(days=60)), ("2.50", CHANGE)):
        GpuPrice.objects.create(cluster=cluster, per_gpu_hour=Decimal(price), valid_from=since)
    nlp = make_team("nlp")
    carol = make_user("carol", nlp)
    ran(team, alice, dt.datetime(2026, 11, 10, 8, tzinfo=dt.UTC), hours=1, total_gpus=2)
    ran(nlp, carol, dt.datetime(2026, 11, 16, 8, tzinfo=dt.UTC), hours=4)
    meter_ended()
    ran(team, alice, NOW - dt.timedelta(hours=1), 0, running=True)
    return nlp


def test_the_api_gives_each_rows_cost_and_the_total_and_only_my_teams(spent, api):
    answer = api.get("/usage", by="day").json()
    assert [(row["day"], row["cost"]) for row in answer["rows"]] == [
        ("2026-11-10", "3.00"),
        ("2026-11-20", "2.50"),
    ]
    assert (answer["total_cost"], answer["currency"]) == ("5.50", "USD")
    assert api.get("/usage", team="nlp").status_code == 404  # its 10.00 never shows
    assert "10.00" not in api.get("/usage", by="cluster").content.decode()


def test_the_page_and_the_csv_show_the_cost(spent, alice, settings):
    settings.SF_CURRENCY = "EUR"
    page = Client()
    page.force_login(alice)
    html = page.get("/usage/").content.decode()
    assert "costing 5.50 EUR" in html
    assert "<td>vision</td><td>alice</td><td>3.00</td><td>5.50 EUR</td>" in html
    assert "nlp" not in html and "10.00" not in html
    rows = list(csv.reader(io.StringIO(page.get("/usage/", {"format": "csv"}).content.decode())))
    assert [row[-2:] for row in rows] == [["cost", "currency"], ["3.00", "EUR"], ["2.50", "EUR"]]


def test_a_jobs_json_has_its_cost(spent, api, team, alice):
    job = queued_job(team, alice, total_gpus=2)
    with_attempt(
        job,
        "SUCCEEDED",
        start_time=CHANGE - dt.timedelta(hours=1),
        end_time=CHANGE + dt.timedelta(hours=1),
    )
    answer = api.get(f"/jobs/{job.pk}").json()
    assert (answer["cost"], answer["currency"]) == ("8.00", "USD")  # 2 GPU-h at 1.50, 2 at 2.50
    listed = {row["id"]: row["cost"] for row in api.get("/jobs").json()["items"]}
    assert listed[job.pk] == "8.00"


def test_a_jobs_attempts_say_their_cost_and_where_the_price_changed(spent, api, team, alice):
    job = queued_job(team, alice, total_gpus=1)
    with_attempt(
        job,
        "SUCCEEDED",
        start_time=CHANGE - dt.timedelta(hours=2),
        end_time=CHANGE + dt.timedelta(hours=2),
    )
    (attempt,) = api.get(f"/jobs/{job.pk}/attempts").json()
    assert attempt["cost"] == "8.00"  # 2 GPU-h at 1.50, 2 at 2.50
    assert attempt["cost_split"] == (
        "billed at 2 prices (the price changed while it ran): 1.50 per GPU-hour from "
        "2026-11-14 22:00 UTC; 2.50 per GPU-hour from 2026-11-15 00:00 UTC"
    )
