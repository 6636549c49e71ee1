"""Usage by GPU type (issue 50): each usage record and line carries the GPU type its jobs asked
for ("" when they asked for none), the type their cost is priced by; a type's totals are its
attempts' own, metered or not, in the records, the API, the page and the CSV."""

import csv
import datetime as dt
import io
from collections import defaultdict
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from jobs.models import Attempt, AttemptActivity, GpuPrice
from metering.consistency import check_usage_records
from metering.cost import attempt_cost
from metering.models import UsageRecord
from metering.prices import price_book
from metering.records import meter_ended
from metering.usage import totals_by, usage_lines
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
NOV, DEC = dt.date(2026, 11, 1), dt.date(2026, 12, 1)
NOV10 = dt.datetime(2026, 11, 10, 8, 0, tzinfo=dt.UTC)
ONE_US = dt.timedelta(microseconds=1)
HOUR_US = 3600 * 10**6


@pytest.fixture(autouse=True)
def _frozen(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)


def ran(team, user, gpu_type: str, start, hours=None, total_gpus=1, active_us=0, idle_us=0):
    job = queued_job(team, user, total_gpus=total_gpus, gpu_type=gpu_type)
    end = None if hours is None else start + dt.timedelta(hours=hours)
    attempt = with_attempt(
        job, "RUNNING" if end is None else "SUCCEEDED", start_time=start, end_time=end
    )
    if active_us or idle_us:
        AttemptActivity.objects.create(
            attempt=attempt, active_gpu_us=active_us, idle_gpu_us=idle_us
        )
    return attempt


@pytest.fixture
def mixed(team, alice):
    """On Nov 10, alice: 2 A100s for 2 h (3 GPU-h active, 1 idle) and 1 GPU of any type for
    3 h, both metered; then, not metered yet, 1 H100 for 1 h on Nov 11 and 4 A100s running
    for the last 30 minutes. A100s cost 4.00 per GPU-hour, any other GPU 1.00."""
    for gpu_type, per_gpu_hour in (("", "1.00"), ("a100", "4.00")):
        GpuPrice.objects.create(
            cluster=team.default_cluster,
            gpu_type=gpu_type,
            per_gpu_hour=Decimal(per_gpu_hour),
            valid_from=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
        )
    ran(team, alice, "a100", NOV10, 2, total_gpus=2, active_us=3 * HOUR_US, idle_us=HOUR_US)
    ran(team, alice, "", NOV10, 3)
    assert meter_ended() == 2
    ran(team, alice, "h100", NOV10 + dt.timedelta(days=1), 1)
    ran(team, alice, "a100", NOW - dt.timedelta(minutes=30), total_gpus=4)
    client = Client()
    client.force_login(alice)
    return client


def ledger_by_type() -> tuple[dict[str, int], dict[str, int]]:
    """GPU-µs and cost per GPU type, summed attempt by attempt from the ledger."""
    gpu_us: dict[str, int] = defaultdict(int)
    cost: dict[str, int] = defaultdict(int)
    book = price_book()
    for attempt in Attempt.objects.select_related("job"):
        end = attempt.end_time or NOW
        gpu_us[attempt.job.gpu_type] += (end - attempt.start_time) // ONE_US * attempt.total_gpus
        cost[attempt.job.gpu_type] += attempt_cost(
            attempt.job.cluster_id,
            attempt.job.gpu_type,
            attempt.start_time,
            attempt.end_time,
            attempt.total_gpus,
            NOW,
            book,
        )
    return dict(gpu_us), dict(cost)


def test_per_type_totals_equal_the_ledgers_per_attempt_sum(mixed, team):
    lines = usage_lines({team.pk: team.name}, NOV, DEC, NOW)
    gpu_us, cost = ledger_by_type()
    assert gpu_us == {"a100": 6 * HOUR_US, "": 3 * HOUR_US, "h100": HOUR_US}
    assert {key: us for (key,), us in totals_by(lines, "gpu_type")} == gpu_us
    assert {key: micros for (key,), micros in totals_by(lines, "gpu_type", cost=True)} == cost
    assert cost["a100"] == 6 * 4 * 10**6 and cost["h100"] == 10**6  # its type has no price
    meter_ended()  # the H100 hour moves into the records: the answer stays the same
    again = usage_lines({team.pk: team.name}, NOV, DEC, NOW)
    assert {key: us for (key,), us in totals_by(again, "gpu_type")} == gpu_us
    assert check_usage_records(NOW).violations == []


def test_an_a100_job_and_a_typeless_one_are_separate_lines_and_records(mixed, team, alice):
    nov10 = [
        line for line in usage_lines({team.pk: team.name}, NOV, DEC, NOW) if line.day.day == 10
    ]
    assert [(line.gpu_type, line.gpu_us, line.active_us, line.idle_us) for line in nov10] == [
        ("", 3 * HOUR_US, 0, 0),
        ("a100", 4 * HOUR_US, 3 * HOUR_US, HOUR_US),
    ]
    records = UsageRecord.objects.filter(day=NOV10.date(), team=team, user=alice)
    assert sorted(records.values_list("gpu_type", "gpu_us", "cost_micros")) == [
        ("", 3 * HOUR_US, 3 * 10**6),
        ("a100", 4 * HOUR_US, 16 * 10**6),
    ]


def test_the_api_groups_by_gpu_type_with_activity_and_cost(mixed, api):
    answer = api.get("/usage", by="gpu_type")
    assert answer.status_code == 200
    assert answer.json()["by"] == "gpu_type"
    assert answer.json()["rows"] == [
        {
            "gpu_type": "",  # jobs that asked for no type
            "gpu_seconds": 3 * 3600.0,
            "gpu_hours": 3.0,
            "borrowed_gpu_hours": 0.0,
            "cost": "3.00",
            "active_gpu_hours": 0.0,
            "idle_gpu_hours": 0.0,
            "efficiency": 0.0,
        },
        {
            "gpu_type": "a100",
            "gpu_seconds": 6 * 3600.0,
            "gpu_hours": 6.0,
            "borrowed_gpu_hours": 0.0,
            "cost": "24.00",
            "active_gpu_hours": 3.0,
            "idle_gpu_hours": 1.0,
            "efficiency": 0.5,
        },
        {
            "gpu_type": "h100",
            "gpu_seconds": 3600.0,
            "gpu_hours": 1.0,
            "borrowed_gpu_hours": 0.0,
            "cost": "1.00",
            "active_gpu_hours": 0.0,
            "idle_gpu_hours": 0.0,
            "efficiency": 0.0,
        },
    ]


@pytest.mark.parametrize("by", ["team", "user", "cluster", "gpu_type", "day"])
def test_every_grouping_of_the_api_carries_activity_and_efficiency(mixed, api, by):
    rows = api.get("/usage", by=by).json()["rows"]
    assert sum(row["active_gpu_hours"] for row in rows) == 3.0
    assert sum(row["idle_gpu_hours"] for row in rows) == 1.0
    assert all(
        row["efficiency"] == round(row["active_gpu_hours"] / row["gpu_hours"], 4) for row in rows
    )


def test_the_page_shows_a_table_by_gpu_type_and_activity_in_every_table(mixed):
    html = mixed.get("/usage/", {"month": "2026-11"}).content.decode()
    assert "<h2>By GPU type</h2>" in html
    assert "<td>any type</td><td>3.00</td><td>3.00 USD</td><td>0.00</td><td>0.00</td>" in html
    assert "<td>a100</td><td>6.00</td><td>24.00 USD</td><td>3.00</td><td>1.00</td>" in html
    assert "<td>h100</td><td>1.00</td><td>1.00 USD</td>" in html
    # Every table has the activity columns: team, user, cluster, GPU type, day.
    assert html.count("<th>efficiency</th>") == 0  # the header carries its meaning as a title
    assert html.count(">efficiency</th>") == 5
    # vision: 10 GPU-h, 3 active: 30 %, in the tables by team, by user and by cluster.
    assert html.count("<td>3.00</td><td>1.00</td><td>30 %</td>") == 3


def test_the_csv_has_a_gpu_type_column(mixed):
    sheet = mixed.get("/usage/", {"month": "2026-11", "format": "csv"}).content.decode()
    rows = list(csv.DictReader(io.StringIO(sheet)))
    shown = [(r["day"], r["gpu_type"], r["gpu_hours"], r["efficiency"], r["cost"]) for r in rows]
    assert shown == [
        ("2026-11-10", "", "3.0", "0.0", "3.00"),
        ("2026-11-10", "a100", "4.0", "0.75", "16.00"),
        ("2026-11-11", "h100", "1.0", "0.0", "1.00"),
        ("2026-11-20", "a100", "2.0", "0.0", "8.00"),
    ]


def test_a_type_name_is_escaped_on_the_page(team, alice):
    """Types reach the ledger through the API's pattern, but the page must not trust that."""
    hostile = '<img src=x onerror="alert(1)">'
    ran(team, alice, hostile, NOV10, 1)
    meter_ended()
    client = Client()
    client.force_login(alice)
    html = client.get("/usage/", {"month": "2026-11"}).content.decode()
    assert "<td>&lt;img src=x onerror=&quot;alert(1)&quot;&gt;</td><td>1.00</td>" in html
    assert hostile not in html


def test_records_metered_before_they_had_a_type_still_agree_with_their_attempts(mixed):
    """Migration 0005 kept every existing record, typeless: the consistency check sums the
    types of a day, team, user and cluster, so such records are not reported."""
    meter_ended()
    UsageRecord.objects.filter(gpu_type="").delete()
    UsageRecord.objects.filter(gpu_type="a100").update(
        gpu_type="", gpu_us=7 * HOUR_US, cost_micros=19 * 10**6
    )  # as the two metered attempts were recorded before 0005
    assert check_usage_records(NOW).violations == []
    UsageRecord.objects.filter(gpu_type="").update(gpu_us=6 * HOUR_US)
    (wrong,) = check_usage_records(NOW).violations
    assert (
        "the records say 21600000000 GPU-µs" in wrong
        and "the metered attempts 25200000000" in wrong
    )
