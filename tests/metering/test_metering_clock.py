"""Metering on a controllable clock: the real scheduler, launcher and reconciler, a scripted engine.

Every `timezone.now()` in the code under test answers the test's clock, and each tick gets the
same instant as `now=`, so every billed microsecond is known in advance. Only running time is
billed (docs/ARCHITECTURE.md, invariant 5): from the attempt's start_time, which the reconciler sets
when it first sees the entrypoint running, to its end; queued, pending and paused time never.

The scripted engine reports no times of its own, so an ended attempt is metered only once the
grace in which its engine could still bound its end is past (`ENGINE_END_GRACE`).
"""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.actions import control
from jobs.executors import Observation
from jobs.ledger.lifecycle import requeue_due_retries
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job, JobEvent
from jobs.states import JobStatus
from metering.models import UsageRecord
from metering.records import ENGINE_END_GRACE, meter_ended, team_gpu_us, usage_rows
from metering.usage import job_gpu_seconds
from tests.factories import queued_job
from tests.scripted import ScriptedExecutor

pytestmark = pytest.mark.django_db
S = JobStatus
US = 1_000_000  # GPU-microseconds in one GPU-second
T0 = dt.datetime(2026, 11, 10, 8, 0, tzinfo=dt.UTC)
DAY = T0.date()


def minutes(n: float) -> dt.timedelta:
    return dt.timedelta(minutes=n)


class Clock:
    """What `timezone.now()` answers while the test runs; only the test moves it."""

    def __init__(self, start: dt.datetime) -> None:
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    # The scheduler, launcher, reconciler, actions, transitions, lifecycle and metering all
    # call `timezone.now()` through the module, so one patch reaches every one of them.
    fake = Clock(T0)
    monkeypatch.setattr(timezone, "now", fake)
    return fake


@pytest.fixture
def engine(use_executor) -> ScriptedExecutor:
    """One scripted engine behind every executor lookup, the scheduler's capacity question too."""
    fake = ScriptedExecutor()
    use_executor(fake)
    return fake


@pytest.fixture
def vision(make_team, make_user):
    team = make_team("vision", gpu_quota=4)
    return team, make_user("alice", team), make_user("bob", team)


def tick(clock: Clock, at: dt.datetime) -> list[int]:
    """A scheduler tick at `at`, and the launch of what it admitted (as the Celery task does)."""
    clock.now = at
    admitted = admit_queued_jobs(now=at).admitted
    launch_attempts(admitted)
    return admitted


def observe(engine: ScriptedExecutor, clock: Clock, at: dt.datetime, job: Job, native: str, **obs):
    """From `at` on, the engine shows `native` for the current attempt; the reconciler looks."""
    clock.now = at
    current = Job.objects.values_list("current_attempt", flat=True).get(pk=job.pk)
    engine.states[Attempt.objects.get(pk=current).job_ref] = Observation(native, **obs)
    reconcile_all(now=at)


def run_attempt(engine, clock, job, admit, start, end, native="OK", **obs):
    """Admit the job at `admit`; it runs from `start` and ends as `native` at `end`."""
    assert len(tick(clock, admit)) == 1
    observe(engine, clock, admit, job, "QUEUED")
    observe(engine, clock, start, job, "RUN")
    observe(engine, clock, end, job, native, **obs)


def attempt_times(job: Job) -> list[tuple]:
    return list(
        Attempt.objects.filter(job=job)
        .order_by("number")
        .values_list("submitted_at", "start_time", "end_time")
    )


def recorded(team) -> dict:
    rows = UsageRecord.objects.filter(team=team).values_list("day", "user_id", "gpu_us")
    return {(day, user): gpu_us for day, user, gpu_us in rows if gpu_us}


def test_queued_an_hour_pending_10_minutes_running_30_minutes_on_4_gpus_is_7200_gpu_seconds(
    engine, clock, vision
):
    team, alice, bob = vision
    blocker = queued_job(team, bob, total_gpus=4, submitted_at=T0)
    job = queued_job(team, alice, total_gpus=4, submitted_at=T0)
    tick(clock, T0)
    observe(engine, clock, T0 + minutes(1), blocker, "QUEUED")  # pending on the engine
    tick(clock, T0 + minutes(30))
    job.refresh_from_db()
    assert job.status == S.QUEUED and job.status_reason.startswith("waiting for quota")
    clock.now = T0 + minutes(60)
    control.stop_job(bob, blocker.pk)  # it never ran: nothing to bill for it either

    admitted_at, started, ended = T0 + minutes(60), T0 + minutes(70), T0 + minutes(100)
    assert len(tick(clock, admitted_at)) == 1
    observe(engine, clock, admitted_at, job, "QUEUED")
    observe(engine, clock, started, job, "RUN")
    key = (DAY, team.pk, alice.pk, team.default_cluster_id, "")
    assert usage_rows(DAY, DAY + dt.timedelta(days=1), now=started + minutes(15)) == {
        key: 15 * 60 * 4 * US
    }
    observe(engine, clock, ended, job, "OK", exit_code=0)

    job.refresh_from_db()
    assert job.status == S.SUCCEEDED
    assert attempt_times(job) == [(admitted_at, started, ended)]
    later = ended + dt.timedelta(hours=5)
    assert job_gpu_seconds(job.attempts.all(), now=later) == 7200.0
    assert usage_rows(DAY, DAY + dt.timedelta(days=1), now=later) == {key: 7200 * US}
    meter_ended(now=later)  # a scheduler tick may have metered the blocker's attempt already
    assert not Attempt.objects.filter(metered=False).exists()
    assert recorded(team) == {(DAY, alice.pk): 7200 * US}
    assert usage_rows(DAY, DAY + dt.timedelta(days=1), now=later) == {key: 7200 * US}
    assert team_gpu_us(DAY.replace(day=1), later) == {team.pk: 7200 * US}


def test_an_end_observed_many_times_is_billed_once(engine, clock, vision):
    team, alice, _ = vision
    job = queued_job(team, alice, total_gpus=2, submitted_at=T0)
    end = T0 + minutes(25)
    run_attempt(engine, clock, job, T0, T0 + minutes(5), end, exit_code=0)
    # No tick since the end: the sweep is the first to meter it, once its engine's grace is past.
    assert meter_ended() == 0
    assert meter_ended(now=end + ENGINE_END_GRACE) == 1
    # The engine keeps reporting the end, once with a later end time; sweeps run in between.
    for n, seen_end in enumerate([None, end + minutes(3), None, None], start=1):
        observe(engine, clock, end + minutes(4 * n), job, "OK", exit_code=0, end_time=seen_end)
        assert meter_ended() == 0
    assert attempt_times(job) == [(T0, T0 + minutes(5), end)]
    assert recorded(team) == {(DAY, alice.pk): 20 * 60 * 2 * US}
    assert usage_rows(DAY, DAY + dt.timedelta(days=1), now=end + minutes(60)) == {
        (DAY, team.pk, alice.pk, team.default_cluster_id, ""): 20 * 60 * 2 * US
    }
    ends = JobEvent.objects.filter(job=job, kind="status", to_status=S.SUCCEEDED)
    assert ends.count() == 1


def test_pause_and_resume_bill_only_the_running_time_of_both_attempts(engine, clock, vision):
    team, alice, _ = vision
    job = queued_job(team, alice, total_gpus=2, submitted_at=T0)
    assert len(tick(clock, T0 + minutes(5))) == 1
    observe(engine, clock, T0 + minutes(8), job, "RUN")
    paused_at = T0 + minutes(30)
    clock.now = paused_at
    control.pause_job(alice, job.pk)
    # The engine takes a while to kill the process; the orphan sweep sees it still running.
    reconcile_all(now=paused_at + minutes(1))
    observe(engine, clock, paused_at + minutes(2), job, "BAD", exit_code=-15)

    clock.now = T0 + minutes(120)
    control.resume_job(alice, job.pk)
    run_attempt(
        engine, clock, job, T0 + minutes(125), T0 + minutes(135), T0 + minutes(145), exit_code=0
    )

    assert attempt_times(job) == [
        (T0 + minutes(5), T0 + minutes(8), paused_at),
        (T0 + minutes(125), T0 + minutes(135), T0 + minutes(145)),
    ]
    running_s = (22 + 10) * 60
    assert job_gpu_seconds(job.attempts.all(), now=T0 + minutes(300)) == running_s * 2
    meter_ended(now=T0 + minutes(300))
    assert not Attempt.objects.filter(metered=False).exists()
    assert recorded(team) == {(DAY, alice.pk): running_s * 2 * US}


@pytest.mark.parametrize("how", ["by hand", "automatically"])
def test_a_failed_attempt_and_its_retry_bill_only_their_running_time(engine, clock, vision, how):
    team, alice, _ = vision
    retries = 1 if how == "automatically" else 0
    job = queued_job(
        team, alice, total_gpus=3, submitted_at=T0, max_retries=retries, retry_cooldown_s=3600
    )
    failed_at = T0 + minutes(17)
    run_attempt(engine, clock, job, T0, T0 + minutes(2), failed_at, native="BAD", exit_code=1)
    job.refresh_from_db()
    assert job.status == S.FAILED
    meter_ended(now=failed_at + ENGINE_END_GRACE)
    if how == "by hand":
        clock.now = T0 + minutes(40)
        control.retry_job(alice, job.pk)
    else:
        assert requeue_due_retries(failed_at + minutes(59)) == []  # the cooldown is an hour
    retry_at = failed_at + minutes(61)
    run_attempt(
        engine, clock, job, retry_at, retry_at + minutes(9), retry_at + minutes(29), exit_code=0
    )

    job.refresh_from_db()
    assert (job.status, job.retry_count, job.attempt_count) == (S.SUCCEEDED, 1, 2)
    running_s = (15 + 20) * 60
    assert job_gpu_seconds(job.attempts.all(), now=retry_at + minutes(60)) == running_s * 3
    meter_ended(now=retry_at + minutes(60))
    assert not Attempt.objects.filter(metered=False).exists()
    assert recorded(team) == {(DAY, alice.pk): running_s * 3 * US}


def test_an_attempt_across_a_month_boundary_is_split_between_the_months(engine, clock, vision):
    team, alice, _ = vision
    oct31, nov1 = dt.date(2026, 10, 31), dt.date(2026, 11, 1)
    october, november = (dt.date(2026, 10, 1), nov1), (nov1, dt.date(2026, 12, 1))
    midnight = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    job = queued_job(team, alice, total_gpus=4, submitted_at=midnight - minutes(120))
    assert len(tick(clock, midnight - minutes(60))) == 1
    observe(engine, clock, midnight - minutes(30), job, "RUN")
    cluster = team.default_cluster_id
    live = midnight + minutes(15)
    assert usage_rows(*october, now=live) == {(oct31, team.pk, alice.pk, cluster, ""): 7200 * US}
    assert usage_rows(*november, now=live) == {(nov1, team.pk, alice.pk, cluster, ""): 3600 * US}
    assert team_gpu_us(nov1, live) == {team.pk: 3600 * US}

    observe(engine, clock, midnight + minutes(45), job, "OK", exit_code=0)
    assert meter_ended(now=midnight + minutes(45) + ENGINE_END_GRACE) == 1
    later = midnight + dt.timedelta(days=3)
    assert usage_rows(*october, now=later) == {(oct31, team.pk, alice.pk, cluster, ""): 7200 * US}
    assert usage_rows(*november, now=later) == {(nov1, team.pk, alice.pk, cluster, ""): 10800 * US}
    assert recorded(team) == {(oct31, alice.pk): 7200 * US, (nov1, alice.pk): 10800 * US}
    assert team_gpu_us(nov1, later) == {team.pk: 10800 * US}  # November's budget sees November
    assert job_gpu_seconds(job.attempts.all(), now=later) == 18000.0


def test_a_start_learned_after_the_pause_and_a_tick_is_billed_in_the_records(engine, clock, vision):
    team, alice, _ = vision
    job = queued_job(team, alice, total_gpus=2, submitted_at=T0)
    tick(clock, T0)
    observe(engine, clock, T0 + minutes(1), job, "QUEUED")
    clock.now = T0 + minutes(10)  # it started at T0+2 min, but no tick saw it run
    control.pause_job(alice, job.pk)
    tick(clock, T0 + minutes(11))  # the tick meters the closed attempt
    observe(engine, clock, T0 + minutes(12), job, "RUN", start_time=T0 + minutes(2))
    assert attempt_times(job) == [(T0, T0 + minutes(2), T0 + minutes(10))]
    assert job_gpu_seconds(job.attempts.all(), now=T0 + minutes(60)) == 8 * 60 * 2
    meter_ended()
    assert recorded(team) == {(DAY, alice.pk): 8 * 60 * 2 * US}
