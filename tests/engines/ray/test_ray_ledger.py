"""Starforge's ledger driving a real Ray head: scheduler → launcher → Ray → runner → reconciler.

The runner ships its logs to a live API server, as it does in production; the reconciler maps
what Ray reports into the ledger, Ray's pending reason included.
"""

import datetime as dt
import sys
import time
import uuid

import pytest
from django.db import connection

from jobs.actions import control
from jobs.executors.ray import RayExecutor
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Cluster, Job, Team
from jobs.reads import diagnostics
from jobs.states import JobStatus
from jobs.stores import logstore
from tests.factories import queued_job, with_attempt

pytestmark = [pytest.mark.ray, pytest.mark.django_db(transaction=True)]
S = JobStatus


@pytest.fixture
def ray_team(ray_address, tmp_path, settings) -> Team:
    settings.SF_API_URL = ""  # runners run offline unless a test serves them the API
    cluster = Cluster(
        name="ray",
        kind="ray",
        settings={"address": ray_address, "work_dir": str(tmp_path / "ray-work")},
    )
    cluster.full_clean()
    cluster.save()
    return Team.objects.create(name="vision", gpu_quota=8, default_cluster=cluster)


@pytest.fixture
def user(make_user, ray_team):
    return make_user("alice", ray_team)


def ray_job(team: Team, user, **fields) -> Job:
    """A queued job with a run_id no earlier session used: Ray keeps every submission id."""
    job = queued_job(team, user, **fields)
    Job.objects.filter(pk=job.pk).update(run_id=f"t{uuid.uuid4().hex[:12]}")
    job.refresh_from_db()
    return job


@pytest.fixture
def api_for_runners(live_server, settings) -> None:
    """Serve the API to the runners, which then post logs while the test's ticks write."""
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.skip(
            "the live API shares one connection with the test on in-memory SQLite; "
            "run on PostgreSQL (make test) or with SF_SQLITE_TEST_DB"
        )
    settings.SF_API_URL = live_server.url


def tick_until(job: Job, statuses: set[str], timeout: float = 60) -> Job:
    """Run scheduler, launcher and reconciler ticks until the job reaches one of `statuses`."""
    deadline = time.monotonic() + timeout
    while True:
        launch_attempts(admit_queued_jobs().admitted)
        reconcile_all()
        job.refresh_from_db()
        if job.status in statuses:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job is {job.status}, not {statuses}: {job.status_reason}")
        time.sleep(0.2)


def test_a_job_runs_on_ray_from_the_queue_to_success_with_its_logs(ray_team, user, api_for_runners):
    code = "import os, time; print('on', os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(2)"
    job = ray_job(ray_team, user, total_gpus=1, entrypoint=[sys.executable, "-c", code])
    tick_until(job, {S.RUNNING})
    tick_until(job, {S.SUCCEEDED, S.FAILED})
    assert job.status == S.SUCCEEDED, job.status_reason
    attempt = Attempt.objects.get(job=job)
    assert (attempt.job_ref, attempt.exit_code, attempt.native_state) == (
        attempt.backend_name,
        0,
        "SUCCEEDED",
    )
    assert attempt.submitted_at <= attempt.start_time < attempt.end_time
    assert logstore.tail_text(job.pk, 1, 5).startswith("on ")


def test_a_stop_through_starforge_ends_the_ray_job_and_stays_a_stop(ray_team, user):
    job = ray_job(ray_team, user, total_gpus=1, entrypoint=["sleep", "60"])
    tick_until(job, {S.RUNNING})
    control.stop_job(user, job.pk)  # cancels on Ray after commit
    ref = Attempt.objects.get(job=job).job_ref
    executor = RayExecutor(ray_team.default_cluster)
    deadline = time.monotonic() + 40
    while executor.poll([ref])[ref].native_state != "STOPPED":
        assert time.monotonic() < deadline, "Ray did not stop the job"
        time.sleep(0.2)
    reconcile_all()
    job.refresh_from_db()
    assert job.status == S.STOPPED and job.status_reason == "stopped by alice"
    # Closed at the server's clock, then stopped on Ray: the sweep keeps Ray's own times.
    attempt = Attempt.objects.get(job=job)
    assert (attempt.engine_start, attempt.engine_end) == rays_times(ref, ray_team)
    assert_billed_within_the_engines(attempt)


def test_an_ended_attempt_keeps_rays_times_and_is_billed_within_them(ray_team, user):
    job = ray_job(ray_team, user, total_gpus=1, entrypoint=["sleep", "2"])
    tick_until(job, {S.SUCCEEDED, S.FAILED})
    assert job.status == S.SUCCEEDED, job.status_reason
    attempt = Attempt.objects.get(job=job)
    assert (attempt.engine_start, attempt.engine_end) == rays_times(attempt.job_ref, ray_team)
    assert_billed_within_the_engines(attempt)
    # The bill ends at the earlier of the runner's signed exit and Ray's end: within a second
    # below Ray's record (the runner exits a few ms before Ray marks the job ended).
    assert attempt.engine_end - dt.timedelta(seconds=1) <= attempt.end_time <= attempt.engine_end


def rays_times(ref: str, team: Team) -> tuple[dt.datetime, dt.datetime]:
    """The job's start_time and end_time as Ray's own client reads them."""
    from ray.job_submission import JobSubmissionClient

    info = JobSubmissionClient(team.default_cluster.settings["address"]).get_job_info(ref)
    start, end = (
        dt.datetime.fromtimestamp(ms / 1000, dt.UTC) for ms in (info.start_time, info.end_time)
    )
    return start, end


def assert_billed_within_the_engines(attempt: Attempt) -> None:
    """Billed no more than Ray accounts for, and never outside its times (issue 50)."""
    assert attempt.engine_start <= attempt.start_time <= attempt.end_time <= attempt.engine_end
    billed = attempt.end_time - attempt.start_time
    assert billed <= attempt.engine_end - attempt.engine_start


def test_a_job_ray_cannot_place_shows_rays_reason_while_pending(ray_team, user):
    job = ray_job(ray_team, user, total_gpus=8)  # the cluster has 4: only a launch can try it
    attempt = with_attempt(job, S.SUBMITTED)
    launch_attempts([attempt.pk])
    reconcile_all()
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert (job.status, attempt.native_state) == (S.PENDING, "PENDING")
    assert "waiting for resources" in attempt.native_message
    sentences = diagnostics.explain(job)
    assert any(
        s.startswith("The backend says why it waits: Job has not started") for s in sentences
    )
    control.stop_job(user, job.pk)
