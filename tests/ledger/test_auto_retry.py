"""Automatic retries: budget, doubling cooldown with a cap, retryable kinds, cancel by stop."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.actions import control
from jobs.executors import LaunchError, Observation
from jobs.ledger.lifecycle import requeue_due_retries
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job, JobEvent
from jobs.states import JobStatus
from tests.factories import queued_job

pytestmark = pytest.mark.django_db
S = JobStatus


def run_and_fail(backend, job: Job, failure: str = "exit", native: str = "BAD") -> Job:
    """Admit, launch and end the job's next attempt with a failure; returns the fresh row."""
    [attempt_id] = admit_queued_jobs().admitted
    launch_attempts([attempt_id])
    ref = Attempt.objects.get(pk=attempt_id).job_ref
    now = timezone.now()
    backend.states[ref] = Observation(
        native, exit_code=1, start_time=now, end_time=now, failure=failure
    )
    reconcile_all()
    return Job.objects.get(pk=job.pk)


def later(seconds: float) -> dt.datetime:
    return timezone.now() + dt.timedelta(seconds=seconds)


def test_retryable_failure_with_budget_waits_out_the_cooldown(backend, team, alice):
    job = queued_job(team, alice, max_retries=2, retry_cooldown_s=10)
    job = run_and_fail(backend, job)
    assert job.status == S.FAILED and job.next_attempt_at is not None
    assert 9 <= (job.next_attempt_at - timezone.now()).total_seconds() <= 10
    assert "automatic retry 1 of 2 at" in job.status_reason
    assert requeue_due_retries(later(5)) == []
    assert requeue_due_retries(later(11)) == [job.pk]
    job.refresh_from_db()
    assert (job.status, job.retry_count, job.next_attempt_at) == (S.QUEUED, 1, None)
    [attempt_id] = admit_queued_jobs().admitted
    assert Attempt.objects.get(pk=attempt_id).number == 2


def test_cooldown_doubles_each_retry_up_to_the_cap(backend, team, alice, settings):
    settings.SF_RETRY_COOLDOWN_CAP_S = 25
    job = queued_job(team, alice, max_retries=5, retry_cooldown_s=10)
    waits = []
    for _ in range(3):
        job = run_and_fail(backend, job)
        waits.append(round((job.next_attempt_at - timezone.now()).total_seconds()))
        requeue_due_retries(later(60))
    assert waits == [10, 20, 25]


def test_budget_used_up_leaves_the_job_failed_and_says_so(backend, team, alice):
    job = queued_job(team, alice, max_retries=1, retry_cooldown_s=0)
    job = run_and_fail(backend, job)
    requeue_due_retries(later(1))
    job = run_and_fail(backend, job)
    assert (job.status, job.retry_count, job.next_attempt_at) == (S.FAILED, 1, None)
    note = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.NOTE).last()
    assert note.reason == "no automatic retry: the retry budget of 1 is used"


@pytest.mark.parametrize("failure", ["ingest", "deadline"])
def test_failures_that_a_retry_cannot_fix_are_not_retried(backend, team, alice, failure):
    job = run_and_fail(backend, queued_job(team, alice, max_retries=3), failure=failure)
    assert job.status == S.FAILED and job.next_attempt_at is None
    assert JobEvent.objects.filter(
        job=job, reason=f"no automatic retry: {failure} failures are not retried automatically"
    ).exists()


def test_a_spec_the_backend_rejects_is_not_retried(backend, team, alice):
    job = queued_job(team, alice, max_retries=3)
    backend.launch_error = LaunchError("no such partition", permanent=True)
    launch_attempts(admit_queued_jobs().admitted)
    job.refresh_from_db()
    assert job.status == S.FAILED and job.next_attempt_at is None


def test_lost_on_backend_is_retried(backend, team, alice, settings):
    job = queued_job(team, alice, max_retries=1, retry_cooldown_s=0)
    launch_attempts(admit_queued_jobs().admitted)
    reconcile_all(now=later(settings.SF_LOST_GRACE_S + 1))  # the object never shows up
    job.refresh_from_db()
    assert job.status == S.FAILED and job.status_reason.startswith("lost on backend")
    assert job.next_attempt_at is not None


def test_stop_cancels_a_pending_automatic_retry(backend, team, alice):
    job = run_and_fail(backend, queued_job(team, alice, max_retries=2, retry_cooldown_s=5))
    control.stop_job(alice, job.pk)
    job.refresh_from_db()
    assert (job.status, job.next_attempt_at) == (S.STOPPED, None)
    assert requeue_due_retries(later(600)) == []
    assert Job.objects.get(pk=job.pk).status == S.STOPPED


def test_manual_retry_supersedes_the_pending_automatic_one(backend, team, alice):
    job = run_and_fail(backend, queued_job(team, alice, max_retries=2, retry_cooldown_s=60))
    control.retry_job(alice, job.pk)
    job.refresh_from_db()
    assert (job.status, job.retry_count, job.next_attempt_at) == (S.QUEUED, 1, None)


def test_team_defaults_apply_when_the_submit_does_not_say(api, team):
    team.default_max_retries, team.default_retry_cooldown_s = 3, 45
    team.save()
    body = api.post("/jobs", {"entrypoint": ["python", "a.py"]}).json()
    assert (body["max_retries"], body["retry_cooldown_s"], body["retries_left"]) == (3, 45, 3)
    explicit = api.post(
        "/jobs", {"entrypoint": ["a"], "max_retries": 0, "retry_cooldown_s": 1}
    ).json()
    assert (explicit["max_retries"], explicit["retry_cooldown_s"]) == (0, 1)


def test_status_shows_remaining_budget_and_next_attempt(backend, api, team, alice):
    job = run_and_fail(backend, queued_job(team, alice, max_retries=2, retry_cooldown_s=30))
    body = api.get(f"/jobs/{job.pk}").json()
    assert body["retries_left"] == 2 and body["next_attempt_at"] is not None
    requeue_due_retries(later(31))
    assert api.get(f"/jobs/{job.pk}").json()["retries_left"] == 1
