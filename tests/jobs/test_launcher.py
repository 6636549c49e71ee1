"""Launching attempts: at most once per attempt, transient vs permanent failures, stop races."""

import pytest

from jobs.executors import LaunchError
from jobs.ledger.transitions import transition
from jobs.loops.launcher import launch_attempts
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job
from jobs.states import JobStatus
from tests.jobs.factories import queued_job

pytestmark = pytest.mark.django_db
S = JobStatus


def admitted(team, user) -> tuple[Job, Attempt]:
    job = queued_job(team, user)
    [attempt_id] = admit_queued_jobs().admitted
    return job, Attempt.objects.get(pk=attempt_id)


def test_launch_records_job_ref_and_moves_to_pending(backend, team, alice):
    job, attempt = admitted(team, alice)
    launch_attempts([attempt.pk])
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert (job.status, attempt.job_ref) == (S.PENDING, attempt.backend_name)
    assert attempt.pending_at is not None


def test_launching_the_same_attempt_twice_submits_once(backend, team, alice):
    _, attempt = admitted(team, alice)
    launch_attempts([attempt.pk])
    launch_attempts([attempt.pk])
    assert backend.submitted == [attempt.backend_name]


def test_transient_launch_failure_requeues_with_reason(backend, team, alice):
    job, attempt = admitted(team, alice)
    backend.launch_error = LaunchError("engine busy", permanent=False)
    launch_attempts([attempt.pk])
    job.refresh_from_db()
    assert job.status == S.QUEUED
    assert job.status_reason == "launch failed, will retry: engine busy"
    assert Attempt.objects.get(pk=attempt.pk).end_time is not None
    backend.launch_error = None
    [next_attempt] = admit_queued_jobs().admitted
    assert Attempt.objects.get(pk=next_attempt).number == 2


def test_permanent_launch_failure_fails_the_job(backend, team, alice):
    job, attempt = admitted(team, alice)
    backend.launch_error = LaunchError("image not found", permanent=True)
    launch_attempts([attempt.pk])
    job.refresh_from_db()
    assert (job.status, job.status_reason) == (S.FAILED, "launch failed: image not found")


def test_stop_while_launching_cancels_what_was_launched(
    backend, team, alice, django_capture_on_commit_callbacks
):
    job, attempt = admitted(team, alice)
    transition(job.pk, S.STOPPED, actor="alice")
    with django_capture_on_commit_callbacks(execute=True):
        # the launch task read the attempt before the stop landed
        from jobs.loops import launcher

        outcome = launcher._launch_one(
            Attempt.objects.select_related("job__cluster").get(pk=attempt.pk)
        )
        launcher._record([outcome])
    assert Job.objects.get(pk=job.pk).status == S.STOPPED
    assert backend.cancelled == [attempt.backend_name]


def test_a_late_launch_task_does_not_take_back_an_attempt_the_reconciler_adopted(
    backend, team, alice, settings, django_capture_on_commit_callbacks
):
    import datetime as dt

    from django.utils import timezone

    from jobs.loops import launcher
    from jobs.loops.reconciler import reconcile_all

    job, attempt = admitted(team, alice)
    outcome = launcher._launch_one(
        Attempt.objects.select_related("job__cluster").get(pk=attempt.pk)
    )  # launched, then the worker died
    later = timezone.now() + dt.timedelta(seconds=settings.SF_LAUNCH_STUCK_S + 1)
    reconcile_all(now=later)  # the restarted side adopts the backend object
    assert Job.objects.get(pk=job.pk).status == S.PENDING
    with django_capture_on_commit_callbacks(execute=True):
        launcher._record([outcome])  # the redelivered launch task finishes late
    assert backend.cancelled == []
    assert backend.submitted == [attempt.backend_name]


def test_a_long_batch_is_recorded_as_it_goes(backend, team, alice, monkeypatch):
    for _ in range(30):
        queued_job(team, alice, gpus=0)
    attempt_ids = admit_queued_jobs().admitted
    pending_when_submitting: list[int] = []
    submit = backend.submit

    def counting_submit(spec):
        pending_when_submitting.append(Job.objects.filter(status=S.PENDING).count())
        return submit(spec)

    monkeypatch.setattr(backend, "submit", counting_submit)
    launch_attempts(attempt_ids)
    # The 26th launch already sees the first 25 recorded PENDING; all 30 end PENDING.
    assert pending_when_submitting[25] == 25
    assert Job.objects.filter(status=S.PENDING).count() == 30
