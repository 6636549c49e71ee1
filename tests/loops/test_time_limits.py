"""Time limits: given at submit (or by the team's default), enforced by the reconciler on the
attempt's own clock (from when it is really up), and by Slurm and Kubernetes as a backstop; a
job stopped at its limit is STOPPED and never retried automatically."""

import datetime as dt
import json

import pytest
from django.utils import timezone

from jobs.executors import Observation
from jobs.loops.reconciler import reconcile_all
from jobs.models import Attempt, Job, JobEvent
from jobs.reads.diagnostics import explain
from jobs.states import JobStatus
from metering.usage import attempt_gpu_seconds
from tests.api_helpers import assert_refused
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus


@pytest.fixture
def running(team, alice):
    """A 2-GPU job with a 60 s limit and three automatic retries, up since START."""
    job = queued_job(team, alice, total_gpus=2, time_limit_s=60, max_retries=3)
    start = timezone.now() - dt.timedelta(seconds=5)
    attempt = with_attempt(
        job, S.RUNNING, job_ref="ref-1", submitted_at=start, pending_at=start, start_time=start
    )
    return job, attempt


def test_a_running_job_is_stopped_once_past_its_limit_and_not_before(
    backend, running, django_capture_on_commit_callbacks
):
    job, attempt = running
    backend.states["ref-1"] = Observation("RUN", start_time=attempt.start_time)
    reconcile_all(now=attempt.start_time + dt.timedelta(seconds=59))
    job.refresh_from_db()
    assert job.status == S.RUNNING and backend.cancelled == []
    at = attempt.start_time + dt.timedelta(seconds=61)
    with django_capture_on_commit_callbacks(execute=True):  # the cancel is sent after commit
        reconcile_all(now=at)
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.status == S.STOPPED
    assert job.status_reason == "time limit reached: ran 1 min 1 s, its limit is 1 min"
    assert backend.cancelled == ["ref-1"]
    # Billed as run, to the tick that stopped it; never retried automatically.
    assert attempt.end_time == at
    assert attempt_gpu_seconds(attempt.start_time, attempt.end_time, 2, at) == 122
    assert job.next_attempt_at is None and job.retry_count == 0
    event = JobEvent.objects.filter(job=job, to_status=S.STOPPED).get()
    assert event.actor == "reconciler" and event.reason.startswith("time limit reached")
    # Later ticks change nothing (the cancel is the orphan sweep's, if the engine still has it).
    events = JobEvent.objects.count()
    reconcile_all(now=at + dt.timedelta(seconds=10))
    assert JobEvent.objects.count() == events


def test_the_limit_counts_from_the_start_not_from_admission(backend, team, alice):
    job = queued_job(team, alice, time_limit_s=60)
    admitted = timezone.now() - dt.timedelta(hours=1)  # waited an hour on the cluster
    start = timezone.now() - dt.timedelta(seconds=30)
    with_attempt(job, S.RUNNING, job_ref="ref-2", pending_at=admitted, start_time=start)
    backend.states["ref-2"] = Observation("RUN", start_time=start)
    reconcile_all(now=start + dt.timedelta(seconds=50))
    assert Job.objects.get(pk=job.pk).status == S.RUNNING


def test_a_job_without_a_limit_runs_on(backend, team, alice):
    job = queued_job(team, alice)
    long_ago = timezone.now() - dt.timedelta(days=20)
    with_attempt(job, S.RUNNING, job_ref="ref-3", pending_at=long_ago, start_time=long_ago)
    backend.states["ref-3"] = Observation("RUN", start_time=long_ago)
    reconcile_all()
    assert Job.objects.get(pk=job.pk).status == S.RUNNING and backend.cancelled == []


def test_a_running_job_seen_pending_again_is_still_held_to_its_limit(backend, running):
    job, attempt = running
    backend.states["ref-1"] = Observation("QUEUED", message="requeued")
    reconcile_all(now=attempt.start_time + dt.timedelta(seconds=61))
    assert Job.objects.get(pk=job.pk).status == S.STOPPED


def test_an_engines_own_stop_at_the_jobs_limit_is_a_time_limit_stop(backend, running):
    """Slurm's --time (failure "timeout") ended it before a tick of the reconciler did."""
    job, attempt = running
    end = attempt.start_time + dt.timedelta(seconds=120)
    backend.states["ref-1"] = Observation(
        "BAD", start_time=attempt.start_time, end_time=end, failure="timeout", exit_code=None
    )
    reconcile_all(now=end + dt.timedelta(seconds=2))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.status == S.STOPPED and job.next_attempt_at is None
    assert job.status_reason == "time limit reached: ran 2 min, its limit is 1 min"
    assert attempt.end_time == end


def test_an_engines_limit_on_a_job_without_one_stays_a_retryable_failure(backend, team, alice):
    """A Slurm partition's own time limit: the job asked for none, so it is retried."""
    job = queued_job(team, alice, max_retries=1)
    start = timezone.now() - dt.timedelta(hours=4)
    with_attempt(job, S.RUNNING, job_ref="ref-4", pending_at=start, start_time=start)
    backend.states["ref-4"] = Observation(
        "BAD", start_time=start, end_time=timezone.now(), failure="timeout"
    )
    reconcile_all()
    job.refresh_from_db()
    assert job.status == S.FAILED and job.next_attempt_at is not None
    assert Attempt.objects.get(job=job).failure == "exit"


def test_an_engine_deadline_shorter_than_the_jobs_limit_is_not_called_the_time_limit(
    backend, team, alice
):
    """A Kubernetes cluster's own activeDeadlineSeconds ended it before its limit."""
    job = queued_job(team, alice, time_limit_s=3600)
    start = timezone.now() - dt.timedelta(seconds=600)
    with_attempt(job, S.RUNNING, job_ref="ref-5", pending_at=start, start_time=start)
    backend.states["ref-5"] = Observation(
        "BAD", start_time=start, end_time=timezone.now(), failure="deadline"
    )
    reconcile_all()
    job.refresh_from_db()
    assert job.status == S.FAILED and "time limit" not in job.status_reason


def test_diagnostics_say_when_the_limit_stops_a_running_job(running):
    job, attempt = running
    now = attempt.start_time + dt.timedelta(seconds=20)
    end = attempt.start_time + dt.timedelta(seconds=60)
    sentences = explain(Job.objects.get(pk=job.pk), now)
    assert (
        f"Its time limit of 1 min stops it at {end:%Y-%m-%d %H:%M:%S} UTC (40 s from now) "
        "unless it ends before; a time-limit stop is not retried automatically."
    ) in sentences


# -- submit ----------------------------------------------------------------------------------


def test_submit_takes_the_limit_or_the_teams_default(api, team):
    body = {"entrypoint": ["python", "train.py"]}
    assert api.post("/jobs", body).json()["time_limit_s"] is None
    team.default_time_limit_s = 7200
    team.save()
    assert api.post("/jobs", body).json()["time_limit_s"] == 7200
    given = api.post("/jobs", {**body, "time_limit_s": 600}).json()
    assert given["time_limit_s"] == 600 and Job.objects.get(pk=given["id"]).time_limit_s == 600


@pytest.mark.parametrize("limit", [0, -5, 30 * 86400 + 1, "1h", 1.5, True])
def test_a_bad_time_limit_is_refused_and_creates_nothing(api, limit):
    response = api.post("/jobs", {"entrypoint": ["python", "train.py"], "time_limit_s": limit})
    assert_refused(response, 422, "time_limit_s")
    assert not Job.objects.exists()


def test_a_team_admin_sets_and_clears_the_default_limit(api_as, make_user, team):
    admin_api = api_as(make_user("ada", team, role="admin"))

    def patch(body):
        return admin_api.client.patch(
            "/api/v1/teams/vision", json.dumps(body), content_type="application/json"
        )

    assert (
        patch({"default_time_limit_s": 14400}).json()["defaults"]["default_time_limit_s"] == 14400
    )
    team.refresh_from_db()
    assert team.default_time_limit_s == 14400
    assert patch({"default_time_limit_s": None}).json()["defaults"]["default_time_limit_s"] is None
