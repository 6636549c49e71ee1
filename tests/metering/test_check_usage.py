"""`manage.py check_usage`: records agree exactly with metered attempts, deleted jobs included;
a tampered record or a stuck sweep is reported, one line each, with exit status 1."""

import datetime as dt
import io

import pytest
from django.core.management import CommandError, call_command
from django.db.models import F
from django.utils import timezone

from jobs.actions.control import delete_job
from jobs.models import Attempt
from metering.models import UsageRecord
from metering.records import meter_ended, usage_rows
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
START = dt.datetime(2026, 11, 10, 8, 0, tzinfo=dt.UTC)


def ended(team, user, hours=1.0, total_gpus=1, start=START):
    job = queued_job(team, user, total_gpus=total_gpus)
    with_attempt(job, "SUCCEEDED", start_time=start, end_time=start + dt.timedelta(hours=hours))
    return job


def check_usage() -> tuple[str, CommandError | None]:
    out = io.StringIO()
    try:
        call_command("check_usage", stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


def test_the_check_passes_and_says_how_many_attempts_it_compared(team, alice):
    ended(team, alice, total_gpus=2)
    ended(team, alice, hours=30)  # spans three days
    meter_ended()
    out, error = check_usage()
    assert error is None
    assert out == "usage records agree with 2 metered attempts\n"


def test_a_tampered_record_is_reported_with_exit_status_1(team, alice):
    ended(team, alice, total_gpus=2)
    meter_ended()
    UsageRecord.objects.update(gpu_us=F("gpu_us") + 1)
    out, error = check_usage()
    assert error is not None and error.returncode == 1
    assert out.splitlines() == [
        f"2026-11-10 team vision user alice cluster local: the records say {7200 * 10**6 + 1} "
        f"GPU-µs (not counting deleted jobs), the metered attempts {7200 * 10**6}"
    ]


def test_a_record_without_any_attempt_is_reported(team, alice):
    UsageRecord.objects.create(
        day=START.date(), team=team, user=alice, cluster=team.default_cluster, gpu_us=5
    )
    out, error = check_usage()
    assert error is not None
    assert "the records say 5 GPU-µs" in out and "the metered attempts 0" in out


def test_a_deleted_job_stays_billed_and_the_check_still_passes(team, alice):
    keep = ended(team, alice, hours=1)
    gone = ended(team, alice, hours=2, total_gpus=3)
    meter_ended([keep.pk])  # the deleted job's attempt is metered by the delete itself
    since, until = START.date(), START.date() + dt.timedelta(days=1)
    before = usage_rows(since, until, now=START + dt.timedelta(days=1))
    delete_job(alice, gone.pk)
    assert not Attempt.objects.filter(job_id=gone.pk).exists()
    assert usage_rows(since, until, now=START + dt.timedelta(days=1)) == before
    assert sum(before.values()) == (1 + 2 * 3) * 3600 * 10**6
    record = UsageRecord.objects.get()
    assert record.deleted_gpu_us == 2 * 3 * 3600 * 10**6
    out, error = check_usage()
    assert error is None, out
    assert out == "usage records agree with 1 metered attempts\n"


def test_an_attempt_left_unmetered_for_over_ten_minutes_means_the_sweep_is_stuck(team, alice):
    now = timezone.now()
    recent = queued_job(team, alice)
    with_attempt(recent, "SUCCEEDED", start_time=now - dt.timedelta(hours=1), end_time=now)
    stuck = queued_job(team, alice)
    attempt = with_attempt(
        stuck,
        "SUCCEEDED",
        start_time=now - dt.timedelta(hours=1),
        end_time=now - dt.timedelta(minutes=11),
    )
    out, error = check_usage()
    assert error is not None
    assert out.splitlines() == [
        f"attempt {attempt.backend_name} (job {stuck.pk}) ended at "
        f"{attempt.end_time:%Y-%m-%d %H:%M:%S} UTC and is still not metered after 10 minutes: "
        "the metering sweep is stuck"
    ]
    meter_ended()
    assert check_usage()[1] is None


def test_gpu_time_on_borrowed_gpus_is_recorded_apart_and_checked(team, alice, make_team):
    lender = make_team("lab")
    ended(team, alice, hours=1)
    job = queued_job(team, alice, total_gpus=2)
    with_attempt(
        job,
        "SUCCEEDED",
        start_time=START,
        end_time=START + dt.timedelta(hours=3),
        borrowed_from=lender,
    )
    meter_ended()
    record = UsageRecord.objects.get()
    assert (record.gpu_us, record.borrowed_gpu_us) == (7 * 3600 * 10**6, 6 * 3600 * 10**6)
    assert check_usage() == ("usage records agree with 2 metered attempts\n", None)
    UsageRecord.objects.update(borrowed_gpu_us=F("borrowed_gpu_us") - 1)
    out, error = check_usage()
    assert error is not None
    assert out.splitlines() == [
        f"2026-11-10 team vision user alice cluster local: the records say "
        f"{6 * 3600 * 10**6 - 1} GPU-µs on borrowed GPUs (of {7 * 3600 * 10**6}), the metered "
        f"attempts on borrowed GPUs {6 * 3600 * 10**6}"
    ]
