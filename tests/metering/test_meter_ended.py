"""`meter_ended` and `usage_rows`: each ended attempt is added once, split at UTC midnight,
and a running attempt counts live up to now."""

import datetime as dt

import pytest

from metering.models import UsageRecord
from metering.records import meter_ended, usage_rows
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
HOUR_US = 3600 * 10**6
OCT31_23H = dt.datetime(2026, 10, 31, 23, 0, tzinfo=dt.UTC)
OCT, NOV, DEC = dt.date(2026, 10, 1), dt.date(2026, 11, 1), dt.date(2026, 12, 1)


def ended(team, user, start, hours, total_gpus=1):
    job = queued_job(team, user, total_gpus=total_gpus)
    return with_attempt(
        job, "SUCCEEDED", start_time=start, end_time=start + dt.timedelta(hours=hours)
    )


def recorded() -> dict:
    return {
        (r.day, r.team_id, r.user_id, r.cluster_id, r.gpu_type): r.gpu_us
        for r in UsageRecord.objects.all()
    }


def test_an_attempt_across_the_month_boundary_bills_each_month_its_share(team, alice):
    ended(team, alice, OCT31_23H, hours=2, total_gpus=2)
    assert meter_ended() == 1
    october = usage_rows(OCT, NOV, now=OCT31_23H + dt.timedelta(days=5))
    november = usage_rows(NOV, DEC, now=OCT31_23H + dt.timedelta(days=5))
    cluster = team.default_cluster_id
    assert october == {(dt.date(2026, 10, 31), team.pk, alice.pk, cluster, ""): 2 * HOUR_US}
    assert november == {(dt.date(2026, 11, 1), team.pk, alice.pk, cluster, ""): 2 * HOUR_US}


def test_metering_twice_adds_each_attempt_once(team, alice):
    attempt = ended(team, alice, OCT31_23H, hours=1, total_gpus=3)
    assert meter_ended() == 1
    first = recorded()
    assert meter_ended() == 0
    key = (dt.date(2026, 10, 31), team.pk, alice.pk, team.default_cluster_id, "")
    assert recorded() == first == {key: 3 * HOUR_US}
    attempt.refresh_from_db()
    assert attempt.metered


def test_an_attempt_is_counted_once_before_and_after_the_sweep(team, alice):
    ended(team, alice, OCT31_23H, hours=1)
    now = OCT31_23H + dt.timedelta(hours=5)
    before = usage_rows(OCT, DEC, now=now)
    meter_ended()
    assert usage_rows(OCT, DEC, now=now) == before
    assert sum(before.values()) == HOUR_US


def test_a_running_attempt_counts_live_up_to_now_and_is_not_metered(team, alice):
    job = queued_job(team, alice, total_gpus=4)
    with_attempt(job, "RUNNING", start_time=OCT31_23H)
    assert meter_ended() == 0
    rows = usage_rows(NOV, DEC, now=OCT31_23H + dt.timedelta(hours=1, minutes=30))
    assert rows == {
        (dt.date(2026, 11, 1), team.pk, alice.pk, team.default_cluster_id, ""): 4 * HOUR_US // 2
    }
    assert not UsageRecord.objects.exists()


def test_an_attempt_that_never_ran_is_metered_as_nothing(team, alice):
    job = queued_job(team, alice, total_gpus=8)
    with_attempt(job, "FAILED", end_time=OCT31_23H)
    assert meter_ended() == 1
    assert recorded() == {}


def test_usage_rows_filter_by_team_and_user(team, alice, make_team, make_user):
    other = make_team("nlp")
    bob = make_user("bob", other)
    ended(team, alice, OCT31_23H, hours=1)
    ended(other, bob, OCT31_23H, hours=2)
    meter_ended()
    now = OCT31_23H + dt.timedelta(days=1)
    assert sum(usage_rows(OCT, DEC, now=now, teams=[other.pk]).values()) == 2 * HOUR_US
    assert sum(usage_rows(OCT, DEC, now=now, users=[alice.pk]).values()) == HOUR_US
