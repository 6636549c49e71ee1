"""The attempt clocks' bounds: what a job or an engine reports never bills queued time, time
from the future, or an end before the server last saw the attempt alive."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.ledger import clocks
from jobs.models import Attempt
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


@pytest.fixture
def running(team, alice):
    return with_attempt(queued_job(team, alice), S.RUNNING, job_ref="r", submitted_at=at(0))


def test_a_start_before_admission_is_moved_to_admission(running):
    assert clocks.mark_started(running, at(-60), at(10)) == at(0)


def test_a_start_from_the_future_is_moved_to_now(running):
    assert clocks.mark_started(running, at(3600), at(10)) == at(10)


def test_a_start_is_set_once(running):
    clocks.mark_started(running, at(5), at(10))
    assert clocks.mark_started(running, at(7), at(20)) == at(5)


def test_an_end_before_the_last_sighting_alive_is_moved_to_it(running):
    clocks.mark_started(running, at(1), at(1))
    clocks.seen_alive([running.pk], at(40))
    running.refresh_from_db()
    assert clocks.close(running, at(20), at(45), end_reason="exited")
    running.refresh_from_db()
    assert running.end_time == at(40)


def test_an_end_from_the_future_is_now_and_an_end_before_the_start_is_the_start(running):
    clocks.mark_started(running, at(30), at(30))
    assert clocks.bounded_end(running, at(10_000), at(50)) == at(50)
    assert clocks.bounded_end(running, at(5), at(50)) == at(30)


def test_an_attempt_is_closed_once(running):
    assert clocks.close(running, at(5), at(10), end_reason="first")
    assert not clocks.close(running, at(8), at(12), end_reason="second")
    running.refresh_from_db()
    assert (running.end_time, running.end_reason) == (at(5), "first")


def test_a_closed_attempt_is_not_seen_alive_again(running):
    clocks.close_open([running.pk], at(10), "stopped")
    clocks.seen_alive([running.pk], at(20))
    assert Attempt.objects.get(pk=running.pk).alive_at is None


def test_sightings_are_written_at_most_once_per_resolution(running):
    now = timezone.now()
    clocks.seen_alive([running.pk], now)
    clocks.seen_alive([running.pk], now + clocks.ALIVE_RESOLUTION / 2)
    assert Attempt.objects.get(pk=running.pk).alive_at == now


# -- never more than the engine (issue 50) -----------------------------------------------------


def engine_billed(attempt: Attempt) -> tuple[dt.timedelta, dt.timedelta]:
    """(the billed duration, the engine's) of a closed attempt, as stored."""
    attempt.refresh_from_db()
    return attempt.end_time - attempt.start_time, attempt.engine_end - attempt.engine_start


def test_an_engine_start_that_bills_is_the_billed_start_and_its_end_caps_the_bill(running):
    """Slurm's Start, a single pod's container start: the allocation held the GPUs from then,
    though the runner reported its start later; the runner's exit after the engine's end."""
    clocks.mark_started(running, at(7.4), at(8))
    engine = clocks.EngineTimes(at(6), at(60))
    assert clocks.close(running, at(60.6), at(61), engine, end_reason="exited")
    running.refresh_from_db()
    assert (running.start_time, running.end_time) == (at(6), at(60))
    assert (running.engine_start, running.engine_end) == (at(6), at(60))


def test_an_engine_start_before_the_run_bounds_the_bill_but_is_not_billed(running):
    """Ray's start_time is the submission, a gang's the first rank up: what came before the
    attempt's own start (Ray's queue, the other ranks' wait) is never billed."""
    clocks.mark_started(running, at(12), at(12))
    engine = clocks.EngineTimes(at(1), at(50.25), start_bills=False)
    assert clocks.close(running, at(50.25), at(51), engine, end_reason="exited")
    billed, engine_time = engine_billed(running)
    assert (running.start_time, running.end_time) == (at(12), at(50.25))
    assert (running.engine_start, running.engine_end) == (at(1), at(50.25))
    assert billed <= engine_time


def test_a_start_the_engine_says_came_later_moves_to_the_engines(running):
    """Even where the engine's start does not bill, the bill never starts before it (the
    reconciler first saw the gang's last rank up late, a skewed start report)."""
    clocks.mark_started(running, at(3), at(3))
    engine = clocks.EngineTimes(at(5), at(20), start_bills=False)
    assert clocks.close(running, at(20), at(21), engine, end_reason="exited")
    running.refresh_from_db()
    assert (running.start_time, running.end_time) == (at(5), at(20))


def test_whole_second_engine_times_bill_no_more_than_the_engine_and_within_a_second(running):
    """A pod's container ran from 10.7 s to 40.4 s; Kubernetes says 10 and 40 (cut short).
    The bill is the engine's 30 s: not more, and within a second of the true 29.7 s."""
    clocks.mark_started(running, at(11.2), at(11.2))  # the runner's start report
    clocks.seen_alive([running.pk], at(40.3))  # its last log line
    engine = clocks.EngineTimes(at(10), at(40))
    assert clocks.close(running, at(40), at(41), engine, end_reason="exited")
    billed, engine_time = engine_billed(running)
    assert billed <= engine_time
    assert abs(billed - dt.timedelta(seconds=29.7)) <= dt.timedelta(seconds=1)


def test_engine_times_learnt_after_a_stop_keep_a_later_start_and_cap_the_end(running):
    """A stop closed the attempt at the server's clock; Ray's times come with the next poll."""
    clocks.mark_started(running, at(4), at(4))
    clocks.close_open([running.pk], at(30), "stopped by alice")
    running.refresh_from_db()
    clocks.engine_record(running, clocks.EngineTimes(at(1), at(29.5), start_bills=False))
    running.refresh_from_db()
    assert (running.start_time, running.end_time) == (at(4), at(29.5))
    assert (running.engine_start, running.engine_end) == (at(1), at(29.5))
