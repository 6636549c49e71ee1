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
