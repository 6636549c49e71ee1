"""`jobs.loops.windows.apply_window_policy`, the tick's window step, called on its own: a
`--window-policy pause` job is paused when its window closes and queued again when it opens, and
the step says which; a `wait` job and a job a person paused are left alone. On a fixed clock."""

import datetime as dt

import pytest

from jobs.actions import control
from jobs.loops.windows import WindowMoves, apply_window_policy
from jobs.models import Job, ScheduleWindow
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus
TUESDAY_8 = dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.UTC)  # the nights window just closed
TUESDAY_20 = dt.datetime(2026, 12, 1, 20, 0, tzinfo=dt.UTC)  # and opens again


@pytest.fixture
def nights(db):
    return ScheduleWindow.objects.create(name="nights", spec="mon-fri 20:00-08:00, sat-sun")


def running(team, user, window, policy: str) -> Job:
    job = queued_job(team, user, window=window, window_policy=policy)
    with_attempt(job, S.RUNNING, start_time=TUESDAY_8 - dt.timedelta(hours=2))
    return job


def status_of(job: Job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.status, job.status_reason


def test_a_pause_job_pauses_as_its_window_closes_and_queues_again_as_it_opens(team, alice, nights):
    job = running(team, alice, nights, Job.WindowPolicy.PAUSE)
    assert apply_window_policy(TUESDAY_8) == WindowMoves(paused=[job.pk], resumed=[])
    assert status_of(job) == (
        S.PAUSED,
        "paused: window nights closed; the job resumes when it opens (Tue 20:00 UTC)",
    )
    assert apply_window_policy(TUESDAY_8 + dt.timedelta(hours=4)) == WindowMoves([], [])
    assert apply_window_policy(TUESDAY_20) == WindowMoves(paused=[], resumed=[job.pk])
    assert status_of(job) == (S.QUEUED, "window opened: resumed; waiting for the scheduler")
    assert Job.objects.get(pk=job.pk).paused_by_window is False


def test_a_wait_job_runs_on_after_its_window_closes(team, alice, nights):
    job = running(team, alice, nights, Job.WindowPolicy.WAIT)
    assert apply_window_policy(TUESDAY_8) == WindowMoves([], [])
    assert status_of(job)[0] == S.RUNNING


def test_a_job_a_person_paused_stays_paused_when_its_window_opens(team, alice, nights):
    job = running(team, alice, nights, Job.WindowPolicy.PAUSE)
    control.pause_job(alice, job.pk)
    assert apply_window_policy(TUESDAY_20) == WindowMoves([], [])
    assert status_of(job)[0] == S.PAUSED
