"""The reconciler writes a poll's common news (PENDING, RUNNING, SUCCEEDED) for many jobs in one
transaction per group (`jobs.loops.reconciler._in_groups`), exactly as the per-attempt path
writes each, and falls back to that path for the whole group when a job moved on meanwhile."""

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.executors import Observation
from jobs.ledger.halt import halt
from jobs.loops import reconciler
from jobs.loops.reconciler import reconcile_all
from jobs.models import Attempt, Job, JobEvent
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus


def _jobs(team, user, n: int, status: str = S.SUBMITTED) -> list[tuple[Job, Attempt]]:
    admitted = timezone.now() - dt.timedelta(minutes=1)
    made = []
    for i in range(n):
        job = queued_job(team, user, total_gpus=0)
        attempt = with_attempt(job, status, job_ref=f"ref-{i}", submitted_at=admitted)
        made.append((job, attempt))
    return made


def _path(job: Job) -> list[str]:
    events = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.STATUS).order_by("pk")
    return list(events.values_list("to_status", flat=True))


def test_many_jobs_go_pending_running_and_succeeded_as_one_at_a_time_would(backend, team, alice):
    made = _jobs(team, alice, 12)
    start = timezone.now() - dt.timedelta(seconds=20)
    end = start + dt.timedelta(seconds=7)
    for i, _ in enumerate(made):
        backend.states[f"ref-{i}"] = [
            Observation("QUEUED"),
            Observation("RUN", start_time=start),
            Observation("OK", exit_code=0, start_time=start, end_time=end),
        ][i % 3]
    reconcile_all()
    for i, (job, attempt) in enumerate(made):
        job.refresh_from_db()
        attempt.refresh_from_db()
        if i % 3 == 0:
            assert (job.status, _path(job)) == (S.PENDING, [S.PENDING])
            assert attempt.start_time is None and attempt.end_time is None
        elif i % 3 == 1:
            assert (job.status, _path(job)) == (S.RUNNING, [S.PENDING, S.RUNNING])
            assert (attempt.start_time, attempt.end_time) == (start, None)
            assert job.status_reason == "the entrypoint is running"
        else:
            assert (job.status, _path(job)) == (S.SUCCEEDED, [S.PENDING, S.RUNNING, S.SUCCEEDED])
            assert (attempt.start_time, attempt.end_time, attempt.exit_code) == (start, end, 0)
            assert attempt.end_reason == job.status_reason == "exited with code 0"
    # Each event names its attempt, as the per-attempt path's do.
    assert set(JobEvent.objects.values_list("attempt", flat=True)) == {1}
    # Seen again, nothing is written twice.
    events = JobEvent.objects.count()
    reconcile_all()
    assert JobEvent.objects.count() == events


def test_a_tick_over_many_ends_costs_statements_per_group_not_per_job(backend, team, alice):
    def statements(n: int) -> int:
        Job.objects.all().delete()
        backend.states.clear()
        made = _jobs(team, alice, n, S.RUNNING)
        start = timezone.now() - dt.timedelta(seconds=20)
        for i, (_, attempt) in enumerate(made):
            Attempt.objects.filter(pk=attempt.pk).update(start_time=start)
            backend.states[f"ref-{i}"] = Observation(
                "OK", exit_code=0, start_time=start, end_time=timezone.now()
            )
        with CaptureQueriesContext(connection) as queries:
            reconcile_all()
        assert Job.objects.filter(status=S.SUCCEEDED).count() == n
        return len(queries)

    few, many = statements(4), statements(24)
    # The clocks still take a few statements per attempt (each start and end is bounded by
    # its own row); the transitions, their events and the commits are per group. The
    # per-attempt path took some 18 a job.
    assert (many - few) / 20 <= 2, (few, many)


def test_a_job_stopped_during_the_tick_sends_its_group_the_per_attempt_way(
    backend, team, alice, monkeypatch
):
    made = _jobs(team, alice, 3, S.PENDING)
    start = timezone.now() - dt.timedelta(seconds=20)
    end = timezone.now()
    for i, _ in enumerate(made):
        backend.states[f"ref-{i}"] = Observation("OK", exit_code=0, start_time=start, end_time=end)
    stopped_job = made[1][0]
    record_ranks = reconciler._record_ranks
    grouped = []
    in_groups = reconciler._in_groups

    def stop_then_record(executor, attempts, observations):  # a stop after the tick's read
        halt([stopped_job.pk], S.STOPPED, "stopped by alice", actor="alice", now=timezone.now())
        record_ranks(executor, attempts, observations)

    def spy(executor, attempts, mine, now):
        rest = in_groups(executor, attempts, mine, now)
        grouped.append(len(rest))
        return rest

    monkeypatch.setattr(reconciler, "_record_ranks", stop_then_record)
    monkeypatch.setattr(reconciler, "_in_groups", spy)
    reconcile_all()
    assert grouped == [3]  # the group was rolled back whole and went one by one
    stopped_job.refresh_from_db()
    assert stopped_job.status == S.STOPPED
    assert S.SUCCEEDED not in _path(stopped_job)
    stopped = Attempt.objects.get(job=stopped_job)
    assert stopped.exit_code is None and stopped.end_reason != "exited with code 0"
    for job, attempt in (made[0], made[2]):
        job.refresh_from_db()
        attempt.refresh_from_db()
        assert job.status == S.SUCCEEDED
        assert _path(job) == [S.RUNNING, S.SUCCEEDED]
        assert (attempt.start_time, attempt.end_time, attempt.exit_code) == (start, end, 0)


def test_an_end_with_no_known_start_is_left_to_the_per_attempt_path(backend, team, alice):
    """A job that succeeded while nobody saw it start is billed nothing (`_unknown_start`),
    which only the per-attempt path decides."""
    made = _jobs(team, alice, 2, S.PENDING)
    for i, _ in enumerate(made):
        backend.states[f"ref-{i}"] = Observation("OK", exit_code=0, end_time=timezone.now())
    reconcile_all()
    for job, attempt in made:
        job.refresh_from_db()
        attempt.refresh_from_db()
        assert job.status == S.SUCCEEDED
        assert attempt.start_time == attempt.end_time  # nothing billed: no start was known
        assert JobEvent.objects.filter(job=job, kind=JobEvent.Kind.NOTE).exists()
