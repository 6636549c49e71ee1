"""The scheduler tick: order, gates, reasons users can read, idempotence, bounded queries."""

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job, JobEvent, ScheduleWindow
from jobs.states import JobStatus
from tests.factories import queued_job

pytestmark = pytest.mark.django_db
S = JobStatus
MONDAY_NOON = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def statuses(*jobs) -> list[str]:
    return [Job.objects.get(pk=j.pk).status for j in jobs]


def test_admits_every_job_that_fits_in_one_tick(team, alice):
    jobs = [queued_job(team, alice, total_gpus=1) for _ in range(4)]
    result = admit_queued_jobs()
    assert statuses(*jobs) == [S.SUBMITTED] * 4
    assert len(result.admitted) == 4
    assert Attempt.objects.filter(job__in=jobs, number=1).count() == 4


def test_admission_creates_attempt_with_deterministic_backend_name(team, alice):
    job = queued_job(team, alice)
    admit_queued_jobs()
    job.refresh_from_db()
    assert job.current_attempt.backend_name == f"sf-{job.run_id}-a1"
    assert job.attempt_count == 1
    event = JobEvent.objects.get(job=job, to_status=S.SUBMITTED)
    assert (event.from_status, event.actor) == (S.QUEUED, "scheduler")


def test_quota_keeps_the_rest_queued_with_the_numbers(make_team, make_user):
    vision = make_team("vision", gpu_quota=4)
    bob = make_user("bob", vision)
    first, second = queued_job(vision, bob, total_gpus=3), queued_job(vision, bob, total_gpus=2)
    admit_queued_jobs()
    assert statuses(first, second) == [S.SUBMITTED, S.QUEUED]
    second.refresh_from_db()
    assert second.status_reason == (
        "waiting for quota: team vision uses 3 of 4 GPUs; this job needs 2"
    )


def test_small_job_backfills_behind_a_big_one_that_does_not_fit(make_team, make_user):
    vision = make_team("vision", gpu_quota=4)
    bob = make_user("bob", vision)
    running, big, small = (queued_job(vision, bob, total_gpus=g) for g in (3, 2, 1))
    admit_queued_jobs()
    assert statuses(running, big, small) == [S.SUBMITTED, S.QUEUED, S.SUBMITTED]


def test_priority_goes_before_submit_time(make_team, make_user):
    vision = make_team("vision", gpu_quota=1)
    bob = make_user("bob", vision)
    early = queued_job(vision, bob, priority=0)
    urgent = queued_job(vision, bob, priority=10)
    admit_queued_jobs()
    assert statuses(early, urgent) == [S.QUEUED, S.SUBMITTED]


def test_one_team_at_quota_does_not_block_another(make_team, make_user):
    vision, nlp = make_team("vision", gpu_quota=1), make_team("nlp", gpu_quota=2)
    bob, carol = make_user("bob", vision), make_user("carol", nlp)
    jobs = [queued_job(vision, bob), queued_job(vision, bob), queued_job(nlp, carol)]
    admit_queued_jobs()
    assert statuses(*jobs) == [S.SUBMITTED, S.QUEUED, S.SUBMITTED]


def test_capacity_gate_names_the_cluster_and_free_slots(make_team, make_user, local_cluster):
    vision = make_team("vision", gpu_quota=16)  # local cluster has 4 virtual slots
    bob = make_user("bob", vision)
    fits, too_many = queued_job(vision, bob, total_gpus=3), queued_job(vision, bob, total_gpus=2)
    admit_queued_jobs()
    too_many.refresh_from_db()
    assert statuses(fits, too_many) == [S.SUBMITTED, S.QUEUED]
    assert too_many.status_reason == (
        "waiting for capacity: cluster local has 1 of 4 virtual GPU slots free; this job needs 2"
    )


def test_active_jobs_count_against_quota_and_finished_ones_do_not(make_team, make_user):
    vision = make_team("vision", gpu_quota=2)
    bob = make_user("bob", vision)
    for status in (S.RUNNING, S.SUCCEEDED, S.FAILED, S.PAUSED):
        Job.objects.filter(pk=queued_job(vision, bob).pk).update(status=status)
    waiting = [queued_job(vision, bob), queued_job(vision, bob)]
    admit_queued_jobs()
    assert statuses(*waiting) == [S.SUBMITTED, S.QUEUED]


def test_window_keeps_job_queued_and_says_when_it_opens(make_team, make_user):
    nights = ScheduleWindow.objects.create(
        name="nights", timezone="Europe/Berlin", spec="mon-fri 20:00-08:00, sat-sun"
    )
    vision = make_team("vision")
    bob = make_user("bob", vision)
    job = queued_job(vision, bob, window=nights)
    admit_queued_jobs(now=MONDAY_NOON)
    job.refresh_from_db()
    assert job.status == S.QUEUED
    assert job.status_reason == "waiting for window nights (opens Mon 20:00 CET)"
    admit_queued_jobs(now=MONDAY_NOON + dt.timedelta(hours=8))
    assert statuses(job) == [S.SUBMITTED]


def test_team_window_applies_to_jobs_without_their_own(make_team, make_user):
    vision = make_team("vision")
    vision.window = ScheduleWindow.objects.create(name="weekend", spec="sat-sun")
    vision.save()
    job = queued_job(vision, make_user("bob", vision))
    admit_queued_jobs(now=MONDAY_NOON)
    assert statuses(job) == [S.QUEUED]


def test_running_the_tick_twice_changes_nothing_the_second_time(make_team, make_user):
    vision = make_team("vision", gpu_quota=2)
    bob = make_user("bob", vision)
    jobs = [queued_job(vision, bob) for _ in range(3)]
    admit_queued_jobs()
    snapshot = (statuses(*jobs), JobEvent.objects.count(), Attempt.objects.count())
    second = admit_queued_jobs()
    assert second.admitted == []
    assert (statuses(*jobs), JobEvent.objects.count(), Attempt.objects.count()) == snapshot


def test_disabled_cluster_admits_nothing(make_team, make_user, local_cluster):
    vision = make_team("vision")
    job = queued_job(vision, make_user("bob", vision))
    local_cluster.enabled = False
    local_cluster.save()
    admit_queued_jobs()
    job.refresh_from_db()
    assert job.status == S.QUEUED and "disabled" in job.status_reason


def _tick_queries(count: int, make_team, make_user) -> int:
    teams = [make_team(f"t{count}x{i}", gpu_quota=1) for i in range(5)]
    users = [make_user(f"u{count}x{i}", t) for i, t in enumerate(teams)]
    Job.objects.bulk_create(
        [
            Job(
                run_id=f"q{count}-{n}",
                team=teams[n % 5],
                user=users[n % 5],
                cluster=teams[0].default_cluster,
                total_gpus=1,
                entrypoint=["true"],
            )
            for n in range(count)
        ]
    )
    with CaptureQueriesContext(connection) as queries:
        admit_queued_jobs()
    Job.objects.all().delete()
    return len(queries)


def test_tick_query_count_does_not_grow_with_queue_depth(make_team, make_user, local_cluster):
    admit_queued_jobs()  # the first tick records the cluster's health, once
    assert _tick_queries(50, make_team, make_user) == _tick_queries(1500, make_team, make_user)
