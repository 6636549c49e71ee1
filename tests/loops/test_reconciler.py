"""The reconciler's decisions, driven by a scripted executor (a test double of a backend).

The same code runs against the real local executor in test_local_executor.py; here each native
state is scripted so every branch (unmapped, lost, deadline, crash mid-launch) is exercised.
"""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.executors import Observation
from jobs.loops import launcher
from jobs.loops.reconciler import SEEN_RESOLUTION, reconcile_all
from jobs.models import Attempt, Job, JobEvent
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus


@pytest.fixture
def pending(team, alice):
    job = queued_job(team, alice)
    admitted = timezone.now() - dt.timedelta(minutes=5)
    attempt = with_attempt(
        job, S.PENDING, job_ref="ref-1", submitted_at=admitted, pending_at=timezone.now()
    )
    return job, attempt


def status(job) -> str:
    return Job.objects.get(pk=job.pk).status


def test_running_sets_start_time_from_the_backend(backend, pending):
    job, attempt = pending
    started = timezone.now() - dt.timedelta(seconds=5)
    backend.states["ref-1"] = Observation("RUN", start_time=started)
    reconcile_all()
    attempt.refresh_from_db()
    assert status(job) == S.RUNNING and attempt.start_time == started


def test_success_seen_while_pending_walks_through_running(backend, pending):
    job, attempt = pending
    start, end = timezone.now() - dt.timedelta(seconds=9), timezone.now()
    backend.states["ref-1"] = Observation("OK", exit_code=0, start_time=start, end_time=end)
    reconcile_all()
    path = list(JobEvent.objects.filter(job=job).order_by("pk").values_list("to_status", flat=True))
    assert path == [S.RUNNING, S.SUCCEEDED]
    attempt.refresh_from_db()
    assert (attempt.exit_code, attempt.start_time, attempt.end_time) == (0, start, end)


def test_an_end_seen_twice_closes_the_attempt_once(backend, pending):
    job, attempt = pending
    backend.states["ref-1"] = Observation("BAD", exit_code=3, start_time=timezone.now())
    reconcile_all()
    first_end = Attempt.objects.get(pk=attempt.pk).end_time
    events = JobEvent.objects.count()
    reconcile_all()
    assert Attempt.objects.get(pk=attempt.pk).end_time == first_end
    assert JobEvent.objects.count() == events
    assert Job.objects.get(pk=job.pk).status_reason.startswith("exited with code 3")


def test_unmapped_native_state_keeps_status_and_is_recorded_once(backend, pending):
    job, _ = pending
    backend.states["ref-1"] = Observation("WEIRD_NEW_STATE")
    reconcile_all()
    reconcile_all()
    assert status(job) == S.PENDING
    notes = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.OBSERVATION)
    assert [n.data["native_state"] for n in notes] == ["WEIRD_NEW_STATE"]


def test_vanished_backend_object_fails_only_after_the_grace_period(backend, pending, settings):
    job, attempt = pending
    settings.SF_LOST_GRACE_S = 60
    reconcile_all()
    assert status(job) == S.PENDING
    reconcile_all(now=timezone.now() + dt.timedelta(seconds=61))
    job.refresh_from_db()
    assert job.status == S.FAILED and job.status_reason.startswith("lost on backend")
    assert Attempt.objects.get(pk=attempt.pk).end_time is not None


def test_an_object_that_vanishes_is_lost_a_grace_after_it_was_last_seen(backend, pending, settings):
    """Sightings are written at most every SEEN_RESOLUTION; the grace still counts from the
    last one, never less."""
    job, attempt = pending
    settings.SF_LOST_GRACE_S = 60
    backend.states["ref-1"] = Observation("QUEUED")
    t0 = timezone.now()
    reconcile_all(now=t0)
    assert Attempt.objects.get(pk=attempt.pk).last_seen_at == t0
    reconcile_all(now=t0 + dt.timedelta(seconds=5))  # seen again, not written
    assert Attempt.objects.get(pk=attempt.pk).last_seen_at == t0
    del backend.states["ref-1"]
    reconcile_all(now=t0 + dt.timedelta(seconds=5 + 59))  # 59 s after the last sighting
    assert status(job) == S.PENDING
    later = t0 + SEEN_RESOLUTION + dt.timedelta(seconds=61)
    reconcile_all(now=later)
    job.refresh_from_db()
    assert job.status == S.FAILED and job.status_reason.startswith("lost on backend")


def test_sightings_are_written_again_once_older_than_the_resolution(backend, pending):
    _, attempt = pending
    backend.states["ref-1"] = Observation("QUEUED")
    t0 = timezone.now()
    reconcile_all(now=t0)
    reconcile_all(now=t0 + SEEN_RESOLUTION + dt.timedelta(seconds=1))
    seen = Attempt.objects.get(pk=attempt.pk).last_seen_at
    assert seen == t0 + SEEN_RESOLUTION + dt.timedelta(seconds=1)


def test_a_steady_tick_costs_the_same_queries_for_one_waiting_job_as_for_fifty(
    backend, team, alice, django_assert_num_queries
):
    """A poll that says what the ledger holds reads rows, not models, and writes nothing."""

    def waiting(n: int) -> None:
        for _ in range(n):
            job = queued_job(team, alice)
            ref = f"ref-{job.pk}"
            with_attempt(job, S.PENDING, job_ref=ref, pending_at=timezone.now())
            backend.states[ref] = Observation("QUEUED", message="Priority")
        reconcile_all()  # takes the native state and message in: not steady yet

    waiting(1)
    with django_assert_num_queries(3) as one:
        reconcile_all()
    waiting(49)
    with django_assert_num_queries(3) as fifty:
        reconcile_all()
    assert not any(q["sql"].startswith("UPDATE") for q in one.captured_queries)
    assert not any(q["sql"].startswith("UPDATE") for q in fifty.captured_queries)
    assert Attempt.objects.filter(native_message="Priority").count() == 50


def test_poll_error_changes_nothing(backend, pending, settings):
    job, _ = pending
    backend.poll_error = ConnectionError("slurmctld down")
    reconcile_all(now=timezone.now() + dt.timedelta(hours=1))
    assert status(job) == S.PENDING


def test_pending_past_deadline_fails_and_cancels(backend, team, alice):
    job = queued_job(team, alice, pending_deadline_s=30)
    with_attempt(job, S.PENDING, job_ref="ref-9", pending_at=timezone.now())
    backend.states["ref-9"] = Observation("QUEUED")
    reconcile_all(now=timezone.now() + dt.timedelta(seconds=20))
    assert status(job) == S.PENDING and backend.cancelled == []
    reconcile_all(now=timezone.now() + dt.timedelta(seconds=31))
    job.refresh_from_db()
    assert job.status == S.FAILED and job.status_reason.startswith("pending deadline")
    assert backend.cancelled == ["ref-9"]


def test_crash_mid_launch_adopts_the_existing_backend_object(backend, team, alice, settings):
    job = queued_job(team, alice)
    attempt = with_attempt(job, S.SUBMITTED)
    backend.existing.add(attempt.backend_name)  # launched, but the worker died before recording
    reconcile_all(now=timezone.now() + dt.timedelta(seconds=settings.SF_LAUNCH_STUCK_S + 1))
    attempt.refresh_from_db()
    assert status(job) == S.PENDING and attempt.job_ref == attempt.backend_name
    assert backend.submitted == []


def test_crash_before_launch_launches_exactly_once(backend, team, alice, settings):
    job = queued_job(team, alice)
    attempt = with_attempt(job, S.SUBMITTED)
    later = timezone.now() + dt.timedelta(seconds=settings.SF_LAUNCH_STUCK_S + 1)
    reconcile_all(now=later)
    reconcile_all(now=later)
    launcher.launch_attempts([attempt.pk])  # a duplicated Celery delivery changes nothing
    assert backend.submitted == [attempt.backend_name]
    assert status(job) == S.PENDING


def test_submitted_attempt_is_left_alone_while_its_launch_may_still_run(backend, team, alice):
    job = queued_job(team, alice)
    with_attempt(job, S.SUBMITTED)
    reconcile_all()
    assert status(job) == S.SUBMITTED and backend.submitted == []


def test_stopped_attempt_still_alive_is_cancelled_again(backend, pending):
    job, attempt = pending
    Attempt.objects.filter(pk=attempt.pk).update(end_time=timezone.now())
    Job.objects.filter(pk=job.pk).update(status=S.STOPPED)
    backend.states["ref-1"] = Observation("RUN")
    reconcile_all()
    assert backend.cancelled == ["ref-1"]


def test_attempt_closed_before_its_start_was_seen_gets_the_backend_start_time(backend, pending):
    job, attempt = pending
    started = timezone.now() - dt.timedelta(seconds=30)
    stopped = timezone.now() - dt.timedelta(seconds=10)
    Attempt.objects.filter(pk=attempt.pk).update(end_time=stopped)
    Job.objects.filter(pk=job.pk).update(status=S.PAUSED)
    backend.states["ref-1"] = Observation("BAD", exit_code=-15, start_time=started)
    reconcile_all()
    attempt.refresh_from_db()
    assert (attempt.start_time, attempt.end_time) == (started, stopped)  # 20 s metered


@pytest.mark.parametrize(
    "failure, message, code, reason",
    [
        ("oom", "", -9, "out of memory (killed by signal 9)"),
        ("lost", "Evicted: the node was low on memory", None, "lost on backend (Evicted: the"),
        ("preempted", "", 143, "preempted by the backend (exited with code 143)"),
        ("exit", "", 3, "exited with code 3"),
    ],
)
def test_the_failure_reason_leads_with_the_backends_diagnosis(
    backend, pending, failure, message, code, reason
):
    job, _ = pending
    backend.states["ref-1"] = Observation("BAD", exit_code=code, failure=failure, message=message)
    reconcile_all()
    job.refresh_from_db()
    assert job.status == S.FAILED and job.status_reason.startswith(reason), job.status_reason
    assert Attempt.objects.get(job=job).failure == failure


def test_a_job_that_ended_between_ticks_is_billed_from_the_runners_start_report(backend, pending):
    job, attempt = pending
    started = timezone.now() - dt.timedelta(seconds=30)
    ended = timezone.now() - dt.timedelta(seconds=10)
    Attempt.objects.filter(pk=attempt.pk).update(start_time=started)  # POST /ingest/started
    backend.states["ref-1"] = Observation("OK", exit_code=0, end_time=ended)
    reconcile_all()
    attempt.refresh_from_db()
    statuses = list(
        JobEvent.objects.filter(job=job, kind="status")
        .order_by("pk")
        .values_list("to_status", flat=True)
    )
    assert statuses[-2:] == [S.RUNNING, S.SUCCEEDED]
    assert (attempt.start_time, attempt.end_time) == (started, ended)


def test_a_success_with_no_known_start_is_billed_nothing_and_says_so(backend, pending):
    job, attempt = pending
    ended = timezone.now() - dt.timedelta(seconds=1)
    backend.states["ref-1"] = Observation("OK", exit_code=0, end_time=ended)
    reconcile_all()
    attempt.refresh_from_db()
    assert status(job) == S.SUCCEEDED
    assert attempt.start_time == attempt.end_time == ended
    note = JobEvent.objects.get(job=job, kind=JobEvent.Kind.NOTE)
    assert "billed 0 GPU-seconds" in note.reason


def test_a_stop_made_on_the_engine_itself_stops_the_job_without_a_failure(backend, pending):
    job, attempt = pending
    started = timezone.now() - dt.timedelta(seconds=20)
    backend.states["ref-1"] = Observation(
        "HALTED", start_time=started, message="cancelled on the cluster outside Starforge"
    )
    reconcile_all()
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.status == S.STOPPED
    assert job.status_reason == "cancelled on the cluster outside Starforge"
    assert attempt.failure == "" and attempt.start_time == started and attempt.end_time
    assert job.next_attempt_at is None  # never retried automatically


def test_a_tick_over_pending_jobs_costs_a_fixed_number_of_queries(
    backend, team, alice, django_assert_max_num_queries
):
    for i in range(30):
        job = queued_job(team, alice, total_gpus=0)
        with_attempt(job, S.PENDING, job_ref=f"ref-{i}", pending_at=timezone.now())
        backend.states[f"ref-{i}"] = Observation("QUEUED")
    with django_assert_max_num_queries(10):
        reconcile_all()  # the first sight records each native state: one UPDATE for all
    assert set(Attempt.objects.values_list("native_state", flat=True)) == {"QUEUED"}
    with django_assert_max_num_queries(8):
        reconcile_all()


def test_a_running_job_seen_pending_again_neither_steps_back_nor_meets_the_deadline(
    backend, team, alice
):
    job = queued_job(team, alice, pending_deadline_s=1)
    long_ago = timezone.now() - dt.timedelta(hours=1)
    with_attempt(job, S.RUNNING, job_ref="ref-1", pending_at=long_ago, start_time=long_ago)
    backend.states["ref-1"] = Observation("QUEUED", message="BeginTime")
    reconcile_all()
    assert status(job) == S.RUNNING


def test_a_backend_start_time_before_admission_is_read_as_admission(backend, pending):
    job, attempt = pending
    whole_second = attempt.submitted_at.replace(microsecond=0) - dt.timedelta(seconds=1)
    backend.states["ref-1"] = Observation("RUN", start_time=whole_second)
    reconcile_all()
    attempt.refresh_from_db()
    assert attempt.start_time == attempt.submitted_at  # queued time is never billed


def test_reap_stale_gets_the_polls_answer_for_open_attempts_after_the_ledger_took_it(
    backend, pending, team, alice, monkeypatch
):
    job, _ = pending
    stopped = queued_job(team, alice)
    with_attempt(stopped, S.STOPPED, job_ref="ref-closed", end_time=timezone.now())
    ended = Observation("BAD", exit_code=3, start_time=timezone.now())
    backend.states.update({"ref-1": ended, "ref-closed": Observation("RUN")})
    handed = []
    monkeypatch.setattr(
        backend, "reap_stale", lambda found: handed.append((dict(found), status(job))) or []
    )
    reconcile_all()
    # Once per tick, last: the job had already failed; the closed attempt's object is swept
    # (cancelled) instead.
    assert handed == [({"ref-1": ended}, S.FAILED)]
    assert backend.cancelled == ["ref-closed"]
