"""An ended attempt's active and idle GPU-time goes into the usage records with its GPU-time:
split over its UTC days like it, never more than it was billed, each attempt once."""

import datetime as dt

import pytest

from jobs.models import AttemptActivity
from metering.activity import CPU_FLOOR, Report, interval
from metering.activity import RankReport as Rank
from metering.models import UsageRecord
from metering.records import meter_ended
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
HOUR_US = 3600 * 10**6
OCT31_23H = dt.datetime(2026, 10, 31, 23, 0, tzinfo=dt.UTC)


def ended(team, user, hours: float, total_gpus: int, active_us: int, idle_us: int):
    job = queued_job(team, user, total_gpus=total_gpus)
    end = OCT31_23H + dt.timedelta(hours=hours)
    attempt = with_attempt(job, "SUCCEEDED", start_time=OCT31_23H, end_time=end)
    AttemptActivity.objects.create(attempt=attempt, active_gpu_us=active_us, idle_gpu_us=idle_us)
    return attempt


def by_day() -> dict:
    return {
        r.day.day: (r.gpu_us, r.active_gpu_us, r.idle_gpu_us)
        for r in UsageRecord.objects.order_by("day")
    }


def test_activity_is_split_over_the_days_like_the_gpu_time(team, alice):
    ended(team, alice, hours=2, total_gpus=2, active_us=3 * HOUR_US, idle_us=HOUR_US)
    assert meter_ended() == 1
    assert by_day() == {
        31: (2 * HOUR_US, 3 * HOUR_US // 2, HOUR_US // 2),
        1: (2 * HOUR_US, 3 * HOUR_US // 2, HOUR_US // 2),
    }
    assert meter_ended() == 0 and by_day()[1][1] == 3 * HOUR_US // 2  # once


def test_a_forged_activity_is_clamped_to_what_was_billed(team, alice):
    ended(team, alice, hours=0.5, total_gpus=1, active_us=10**15, idle_us=10**15)
    meter_ended()
    ((gpu_us, active, idle),) = by_day().values()
    assert active == gpu_us and idle == 0


def test_an_interval_without_gpu_readings_follows_the_ranks_progress():
    silent = Report(0, [Rank(0, 0, 0.0, []), Rank(1, 0, None, [])])
    judged = interval(silent, gpus_per_rank=4, seconds=10, threshold=10)
    assert (judged.active_us, judged.idle_us, judged.busy, judged.moved) == (0, 80e6, False, False)
    working = Report(0, [Rank(0, 0, 10 * CPU_FLOOR * 2, []), Rank(1, 1, None, [])])
    judged = interval(working, gpus_per_rank=4, seconds=10, threshold=10)
    assert (judged.active_us, judged.idle_us, judged.moved_ranks) == (80e6, 0, [0, 1])


def test_with_gpu_readings_a_gpu_under_the_threshold_is_idle_whatever_the_cpu():
    report = Report(0, [Rank(0, 5, 8.0, [95.0, 9.9, 0.0])])
    judged = interval(report, gpus_per_rank=4, seconds=1, threshold=10)
    # One GPU worked; two read under the threshold; the fourth reported nothing: idle.
    assert (judged.active_us, judged.idle_us, judged.busy) == (1e6, 3e6, True)
    assert judged.moved_ranks == [0]  # its lines and CPU: progress, for the hang rule


def test_usage_answers_carry_active_and_idle_gpu_time_by_team_and_in_the_csv(team, alice, api_as):
    import csv
    import io

    from django.test import Client

    ended(team, alice, hours=2, total_gpus=2, active_us=3 * HOUR_US, idle_us=HOUR_US)
    meter_ended()
    answer = api_as(alice).get(
        "/usage", team="vision", since="2026-10-01", until="2026-12-01", by="team"
    )
    (row,) = answer.json()["rows"]
    assert (row["active_gpu_hours"], row["idle_gpu_hours"], row["efficiency"]) == (3.0, 1.0, 0.75)
    client = Client()
    client.force_login(alice)
    sheet = client.get("/usage/", {"month": "2026-11", "format": "csv"}).content.decode()
    rows = list(csv.DictReader(io.StringIO(sheet)))
    assert [(r["active_gpu_seconds"], r["idle_gpu_seconds"], r["efficiency"]) for r in rows] == [
        ("5400.0", "1800.0", "0.75")
    ]
