"""Launching attempts: at most once per attempt, transient vs permanent failures, stop races."""

import datetime as dt
import math
import threading

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.executors import LaunchError
from jobs.ledger.transitions import transition
from jobs.loops.launcher import launch_attempts
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job
from jobs.states import JobStatus
from tests.factories import queued_job

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


def launch_one(attempt: Attempt):
    """The engine call of a launch task that claimed `attempt`, its outcome not recorded yet."""
    from jobs.loops import launcher

    _, [claimed] = launcher._claim([attempt.pk])
    return launcher._launch_one(claimed, launcher.launch_spec(claimed.job, claimed), math.inf)


def test_stop_while_launching_cancels_what_was_launched(
    backend, team, alice, django_capture_on_commit_callbacks
):
    from jobs.loops import launcher

    job, attempt = admitted(team, alice)
    outcome = launch_one(attempt)  # the launch task called the engine before the stop landed
    transition(job.pk, S.STOPPED, actor="alice")
    with django_capture_on_commit_callbacks(execute=True):
        launcher._record([outcome])
    assert Job.objects.get(pk=job.pk).status == S.STOPPED
    assert backend.cancelled == [attempt.backend_name]


def test_a_late_launch_task_does_not_take_back_an_attempt_the_reconciler_adopted(
    backend, team, alice, settings, django_capture_on_commit_callbacks
):
    from jobs.loops import launcher
    from jobs.loops.reconciler import reconcile_all

    job, attempt = admitted(team, alice)
    outcome = launch_one(attempt)  # launched, then the worker died
    later = timezone.now() + dt.timedelta(seconds=settings.SF_LAUNCH_STUCK_S + 1)
    reconcile_all(now=later)  # the restarted side adopts the backend object
    assert Job.objects.get(pk=job.pk).status == S.PENDING
    with django_capture_on_commit_callbacks(execute=True):
        launcher._record([outcome])  # the redelivered launch task finishes late
    assert backend.cancelled == []
    assert backend.submitted == [attempt.backend_name]


def test_a_long_batch_is_recorded_as_it_goes(backend, team, alice, monkeypatch):
    from jobs.loops import launcher

    for _ in range(30):
        queued_job(team, alice, total_gpus=0)
    attempt_ids = admit_queued_jobs().admitted
    slow = Attempt.objects.get(pk=attempt_ids[0]).backend_name
    others_recorded = threading.Event()
    recorded: list[int] = []
    submit, record = backend.submit, launcher._record

    def slow_first_submit(spec):
        if spec.name == slow:  # held until the 29 others are recorded PENDING
            others_recorded.wait(timeout=10)
        return submit(spec)

    def counting_record(outcomes):
        record(outcomes)
        recorded.extend(o.attempt_id for o in outcomes)
        if Job.objects.filter(status=S.PENDING).count() == 29:
            others_recorded.set()

    monkeypatch.setattr(backend, "submit", slow_first_submit)
    monkeypatch.setattr(launcher, "_record", counting_record)
    launch_attempts(attempt_ids)
    assert others_recorded.is_set()
    assert recorded[-1] == attempt_ids[0]
    assert Job.objects.filter(status=S.PENDING).count() == 30


def test_a_batch_calls_the_engine_launch_threads_at_once(backend, team, alice, monkeypatch):
    from jobs.loops import launcher

    for _ in range(2 * launcher.LAUNCH_THREADS):
        queued_job(team, alice, total_gpus=0)
    attempt_ids = admit_queued_jobs().admitted
    # Every call waits for LAUNCH_THREADS calls in flight: one after another, none would pass.
    all_in_flight = threading.Barrier(launcher.LAUNCH_THREADS, timeout=10)
    submit = backend.submit

    def waiting_submit(spec):
        all_in_flight.wait()
        return submit(spec)

    monkeypatch.setattr(backend, "submit", waiting_submit)
    outcomes = launch_attempts(attempt_ids)
    assert [o.error for o in outcomes if o.error] == []
    assert sorted(backend.submitted) == sorted(
        Attempt.objects.filter(pk__in=attempt_ids).values_list("backend_name", flat=True)
    )


def test_an_attempt_another_launcher_holds_is_left_to_it(backend, team, alice):
    job, attempt = admitted(team, alice)
    Attempt.objects.filter(pk=attempt.pk).update(launch_claimed_at=timezone.now())
    assert launch_attempts([attempt.pk]) == []
    assert backend.submitted == []
    assert Job.objects.get(pk=job.pk).status == S.SUBMITTED


def test_a_dead_launchers_claim_is_taken_over_and_its_job_adopted(backend, team, alice):
    job, attempt = admitted(team, alice)
    backend.existing.add(attempt.backend_name)  # it submitted, then died before recording
    expired = timezone.now() - dt.timedelta(seconds=settings.SF_LAUNCH_CLAIM_S + 1)
    Attempt.objects.filter(pk=attempt.pk).update(launch_claimed_at=expired)
    [outcome] = launch_attempts([attempt.pk])
    assert (outcome.job_ref, backend.submitted) == (attempt.backend_name, [])
    assert Job.objects.get(pk=job.pk).status == S.PENDING


def test_a_dead_launchers_claim_with_nothing_on_the_engine_is_launched(backend, team, alice):
    job, attempt = admitted(team, alice)
    expired = timezone.now() - dt.timedelta(seconds=settings.SF_LAUNCH_CLAIM_S + 1)
    Attempt.objects.filter(pk=attempt.pk).update(launch_claimed_at=expired)
    launch_attempts([attempt.pk])
    assert backend.submitted == [attempt.backend_name]
    assert Job.objects.get(pk=job.pk).status == S.PENDING


def test_an_attempt_not_launched_within_its_claim_is_given_back(backend, team, alice, settings):
    job, attempt = admitted(team, alice)
    settings.SF_LAUNCH_CLAIM_S = 0  # the engine calls queued too long
    [outcome] = launch_attempts([attempt.pk])
    assert outcome.late and backend.submitted == []
    attempt.refresh_from_db()
    assert attempt.launch_claimed_at is None  # the next launcher takes it as a fresh one
    assert Job.objects.get(pk=job.pk).status == S.SUBMITTED
    settings.SF_LAUNCH_CLAIM_S = 120
    launch_attempts([attempt.pk])
    assert backend.submitted == [attempt.backend_name]
