"""The scheduler tick runs its steps in order and says what each did (`TickResult`): a retry
whose cooldown passed joins the same tick's queue, ended attempts are metered before the budgets
read usage, and a tick that finds the turn taken still does the steps that need none. On a fixed
clock."""

import contextlib
import datetime as dt

import pytest

from jobs.loops import scheduler
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus
NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def failed_and_due(team, user) -> Job:
    job = queued_job(team, user, max_retries=1)
    with_attempt(job, S.FAILED, start_time=NOW - dt.timedelta(hours=1), end_time=NOW)
    Job.objects.filter(pk=job.pk).update(next_attempt_at=NOW - dt.timedelta(seconds=1))
    return job


def test_a_due_retry_and_an_ended_attempt_are_the_ticks_first_steps(team, alice):
    retried = failed_and_due(team, alice)
    result = admit_queued_jobs(NOW)
    assert result.retried == [retried.pk]
    assert result.metered == 1  # the failed attempt, metered before budgets read usage
    assert Attempt.objects.get(job=retried, number=1).metered is True
    retried.refresh_from_db()
    assert (retried.status, retried.attempt_count) == (S.SUBMITTED, 2)  # admitted at once
    again = admit_queued_jobs(NOW)
    assert (again.retried, again.metered, again.admitted) == ([], 0, [])


def test_the_ticks_result_says_what_each_writing_step_did(team, alice):
    team.max_gpus_per_job = 4
    team.save()
    queued_job(team, alice, total_gpus=6)  # submitted before the team's limit was set
    fits = queued_job(team, alice, total_gpus=1)
    result = admit_queued_jobs(NOW)
    assert (result.stopped, result.paused, result.resumed, result.requeued) == ([], [], [], [])
    assert (result.outsiders, result.ungranted, result.preempted) == ([], [], [])
    assert result.admitted == [Job.objects.get(pk=fits.pk).current_attempt_id]
    assert result.waiting == 1  # the one reason written
    assert admit_queued_jobs(NOW).waiting == 0  # the same reason is not written again


def test_a_tick_without_the_turn_still_requeues_and_meters_but_admits_nothing(
    team, alice, monkeypatch
):
    retried = failed_and_due(team, alice)

    @contextlib.contextmanager
    def taken():
        yield None  # another tick has the turn

    monkeypatch.setattr(scheduler, "_turn", taken)
    result = admit_queued_jobs(NOW)
    assert result.skipped is True
    assert (result.retried, result.metered, result.admitted) == ([retried.pk], 1, [])
    assert Job.objects.get(pk=retried.pk).status == S.QUEUED  # for the tick that has the turn
