"""Metering never bills a stop or a pause past the engine (issue 50, point 0).

The server closes a stopped or paused attempt at its own clock, then cancels it; when the
engine had ended the attempt a moment before, the reconciler learns the engine's end later and
brings the bill back within it (`jobs.ledger.clocks.engine_record`), but only while the attempt
is not metered. So the metering sweep waits for such an attempt's engine, at most
ENGINE_END_GRACE after its end; usage answers count it meanwhile, exactly once.
"""

import datetime as dt

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.executors import Observation
from jobs.ledger import halt
from jobs.loops.reconciler import ORPHAN_SWEEP, reconcile_all
from jobs.models import Attempt
from jobs.states import JobStatus
from metering.consistency import STUCK_AFTER
from metering.models import UsageRecord
from metering.records import ENGINE_END_GRACE, forget_deleted, meter_ended, usage_rows
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus
ONE_US = dt.timedelta(microseconds=1)
GPUS = 4


@pytest.fixture
def stopped(team, alice):
    """A 4-GPU attempt on the engine (ref-1), running for 10 minutes, stopped by the server
    a moment ago: closed at the server's clock, the engine's end not known yet."""
    now = timezone.now()
    job = queued_job(team, alice, total_gpus=GPUS)
    attempt = with_attempt(
        job,
        S.RUNNING,
        job_ref="ref-1",
        submitted_at=now - dt.timedelta(minutes=11),
        start_time=now - dt.timedelta(minutes=10),
    )
    done = halt.halt([job.pk], S.STOPPED, "stopped by alice", actor="alice", now=now)
    assert done.halted == [job.pk]
    attempt.refresh_from_db()
    assert (attempt.end_time, attempt.engine_end) == (now, None)
    return attempt


def billed_us(attempt: Attempt) -> int:
    return (attempt.end_time - attempt.start_time) // ONE_US * attempt.total_gpus


def usage_of(attempt: Attempt, now: dt.datetime) -> int:
    day = attempt.start_time.astimezone(dt.UTC).date()
    return sum(usage_rows(day, day + dt.timedelta(days=2), now=now).values())


def recorded_us() -> int:
    return sum(UsageRecord.objects.values_list("gpu_us", flat=True))


def test_a_stopped_attempt_waits_for_its_engine_and_is_metered_within_the_engines_end(
    backend, stopped
):
    end = stopped.end_time
    assert meter_ended(now=end + dt.timedelta(seconds=2)) == 0
    assert not Attempt.objects.get(pk=stopped.pk).metered
    # Nothing is lost meanwhile: usage answers count the attempt up to the server's end.
    assert usage_of(stopped, end) == billed_us(stopped)

    # The engine had ended it 0.7 s before the stop (Slurm: whole seconds, the job's own
    # exit just before the cancel); the reconciler's sweep of closed attempts learns it.
    engine_end = end - dt.timedelta(seconds=0.7)
    backend.states["ref-1"] = Observation(
        "HALTED", engine_start=stopped.start_time, engine_end=engine_end
    )
    reconcile_all()
    stopped.refresh_from_db()
    assert (stopped.end_time, stopped.engine_end) == (engine_end, engine_end)
    assert meter_ended(now=end + dt.timedelta(seconds=4)) == 1
    assert recorded_us() == billed_us(stopped) == (10 * 60 - 0.7) * 10**6 * GPUS
    assert usage_of(stopped, end) == billed_us(stopped)  # records and ledger agree


def test_without_the_engines_word_it_is_metered_anyway_after_the_grace(stopped):
    end = stopped.end_time
    assert meter_ended(now=end + ENGINE_END_GRACE - ONE_US) == 0
    assert meter_ended(now=end + ENGINE_END_GRACE) == 1
    stopped.refresh_from_db()
    assert stopped.metered and stopped.end_time == end  # the server's end, as closed
    assert recorded_us() == billed_us(stopped) == 10 * 60 * 10**6 * GPUS


def test_an_engine_end_taken_but_not_yet_applied_to_the_bill_is_waited_for(stopped):
    """`engine_record` writes the engine's times, then brings the end back: a sweep between the
    two must not meter the end past the engine's."""
    end = stopped.end_time
    Attempt.objects.filter(pk=stopped.pk).update(engine_end=end - dt.timedelta(seconds=1))
    assert meter_ended(now=end + dt.timedelta(seconds=2)) == 0
    Attempt.objects.filter(pk=stopped.pk).update(end_time=end - dt.timedelta(seconds=1))
    assert meter_ended(now=end + dt.timedelta(seconds=2)) == 1


def test_an_engine_that_ended_the_attempt_after_the_stop_leaves_the_bill_as_it_was(
    backend, stopped
):
    end = stopped.end_time
    backend.states["ref-1"] = Observation(
        "HALTED", engine_start=stopped.start_time, engine_end=end + dt.timedelta(seconds=3)
    )
    reconcile_all()
    assert meter_ended(now=end + dt.timedelta(seconds=4)) == 1
    stopped.refresh_from_db()
    assert stopped.end_time == end and recorded_us() == billed_us(stopped)


@pytest.mark.parametrize(
    "fields",
    [
        {"job_ref": ""},  # never on an engine
        {"start_time": None},  # never started: nothing billed, nothing to bound
    ],
)
def test_attempts_no_engine_can_bound_are_metered_at_once(team, alice, fields):
    now = timezone.now()
    job = queued_job(team, alice)
    values = {"job_ref": "ref-2", "start_time": now - dt.timedelta(minutes=5), "end_time": now}
    with_attempt(job, S.FAILED, **{**values, **fields})
    assert meter_ended(now=now) == 1


def test_an_end_within_the_engines_is_metered_at_once(team, alice):
    """The reconciler closed it with the engine's times (a job's own end on the engine)."""
    now = timezone.now()
    job = queued_job(team, alice)
    with_attempt(
        job,
        S.SUCCEEDED,
        job_ref="ref-3",
        start_time=now - dt.timedelta(minutes=5),
        end_time=now - dt.timedelta(seconds=0.5),
        engine_end=now,
    )
    assert meter_ended(now=now) == 1


def test_a_deleted_job_is_metered_without_waiting(stopped):
    forget_deleted(stopped.job_id)
    stopped.refresh_from_db()
    assert stopped.metered
    assert UsageRecord.objects.get().deleted_gpu_us == billed_us(stopped)


def test_the_grace_is_some_reconciler_ticks_and_ends_before_the_reconciler_stops_asking():
    tick = dt.timedelta(seconds=settings.CELERY_BEAT_SCHEDULE["reconcile-tick"]["schedule"])
    assert ENGINE_END_GRACE >= 10 * tick
    assert ENGINE_END_GRACE < min(ORPHAN_SWEEP, STUCK_AFTER) / 2
