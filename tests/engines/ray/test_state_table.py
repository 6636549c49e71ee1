"""The Ray executor's tables against the installed Ray: every status and error type has a row.

Ray's payloads here are built with Ray's own `JobDetails` model and serialised the way the
dashboard serialises them (job_head.py `_job_details_to_dict`), so the executor reads exactly
the wire shape of the installed version. No Ray head is needed.
"""

import dataclasses
import datetime as dt
import json

import pytest

from jobs.executors.ray import RayExecutor, observe
from jobs.loops.reconciler import reconcile_all
from jobs.models import Cluster, Job, JobEvent
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.ray
S = JobStatus


def ray_job(status: str, **fields) -> dict:
    """A job as GET /api/jobs/ lists it: Ray's JobInfo (which words the default message)
    wrapped in JobDetails, as job_head.py `list_jobs` does."""
    from ray.dashboard.modules.job.common import JobInfo
    from ray.dashboard.modules.job.pydantic_models import JobDetails

    info = JobInfo(status=status, entrypoint="sh run.sh", **fields)
    details = JobDetails(**dataclasses.asdict(info), type="SUBMISSION", submission_id="sf-r1-a1")
    return json.loads(json.dumps(details.model_dump()))


def test_every_ray_job_status_has_a_row():
    from ray.job_submission import JobStatus as RayJobStatus

    assert set(RayExecutor.STATE_TABLE) == {status.value for status in RayJobStatus}


@pytest.mark.parametrize(
    "ray_status, ledger_status",
    [
        ("PENDING", S.PENDING),
        ("RUNNING", S.RUNNING),
        ("SUCCEEDED", S.SUCCEEDED),
        ("FAILED", S.FAILED),
        ("STOPPED", S.STOPPED),  # stopped behind Starforge's back: an admin's stop
    ],
)
def test_each_ray_status_maps_to_its_ledger_state(ray_status, ledger_status):
    assert RayExecutor.STATE_TABLE[ray_status] == ledger_status
    assert observe(ray_job(ray_status)).native_state == ray_status


def test_every_ray_error_type_has_a_failure_kind():
    from ray.dashboard.modules.job.common import JobErrorType

    assert set(RayExecutor.FAILURE_BY_ERROR_TYPE) == {kind.value for kind in JobErrorType}
    assert set(RayExecutor.FAILURE_BY_ERROR_TYPE.values()) <= {
        "exit",
        "oom",
        "lost",
        "preempted",
        "ingest",
        "rejected",
        "deadline",
    }


@pytest.mark.parametrize(
    "driver_exit_code, exit_code, failure",
    [
        (1, 1, "exit"),
        (3, 3, "exit"),
        (137, -9, "exit"),  # the runner exits 128+N when the entrypoint was killed by signal N
        (143, -15, "exit"),
        (-9, -9, "exit"),  # the runner itself was killed
        (86, None, "ingest"),  # the runner's "ingest failed": the user's code never ran
    ],
)
def test_failed_exit_codes_follow_the_runner_contract(driver_exit_code, exit_code, failure):
    tail = "sf.runner: ingest failed: entrypoint executable 'nope' not found on PATH\n"
    obs = observe(
        ray_job(
            "FAILED",
            driver_exit_code=driver_exit_code,
            error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
            message=f"Job entrypoint command failed with exit code {driver_exit_code}, "
            f"last available logs (truncated to 20,000 chars):\n{tail}",
        )
    )
    assert (obs.exit_code, obs.failure) == (exit_code, failure)
    if failure == "ingest":
        assert obs.message == "ingest failed: entrypoint executable 'nope' not found on PATH"


@pytest.mark.parametrize(
    "error_type, message, failure",
    [
        ("JOB_SUPERVISOR_ACTOR_START_TIMEOUT", "failed to start within 30.0 seconds", "deadline"),
        ("JOB_SUPERVISOR_ACTOR_START_FAILURE", "num_gpus cannot be negative", "rejected"),
        ("JOB_SUPERVISOR_ACTOR_DIED", "Worker exit type: NODE_OUT_OF_MEMORY", "oom"),
        ("JOB_SUPERVISOR_ACTOR_DIED", "the node was terminated", "lost"),
        (None, "Job failed.", "lost"),
    ],
)
def test_failures_without_an_exit_code_follow_rays_error_type(error_type, message, failure):
    obs = observe(ray_job("FAILED", error_type=error_type, message=message))
    assert (obs.exit_code, obs.failure, obs.message) == (None, failure, message)


def test_an_unasked_stop_is_an_admins_stop_and_times_are_utc():
    obs = observe(ray_job("STOPPED", start_time=1_700_000_000_000, end_time=1_700_000_001_500))
    assert obs.failure == "" and "not through Starforge" in obs.message
    assert obs.end_time == dt.datetime(2023, 11, 14, 22, 13, 21, 500000, tzinfo=dt.UTC)
    # Ray's start_time is the submission time: billing from it would bill the PENDING time.
    assert obs.start_time is None and obs.details["start_time"] == 1_700_000_000_000


def test_rays_own_times_are_the_engines_and_its_submission_is_not_billed():
    """Ray's start_time and end_time, kept as the engine's record of the attempt; the start
    only bounds the bill (it is the submission), the end is billed."""
    started, ended = 1_700_000_000_000, 1_700_000_090_250
    for status in ("SUCCEEDED", "FAILED", "STOPPED"):
        obs = observe(ray_job(status, start_time=started, end_time=ended))
        assert (obs.engine_start, obs.engine_end) == (
            dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC),
            dt.datetime(2023, 11, 14, 22, 14, 50, 250000, tzinfo=dt.UTC),
        )
        assert obs.end_time == obs.engine_end and not obs.engine_start_bills
    running = observe(ray_job("RUNNING", start_time=started))
    assert (running.engine_start, running.engine_end) == (obs.engine_start, None)


@pytest.mark.django_db
def test_an_ended_ray_job_is_billed_from_its_run_within_rays_times(monkeypatch, team, alice):
    """Submitted 30 s before the tick saw it RUNNING (Ray's queue): the ledger keeps Ray's
    times, bills none of the queue, and ends the bill at Ray's end, not at a later sighting."""
    cluster = Cluster.objects.create(
        name="ray", kind="ray", settings={"address": "http://127.0.0.1:9"}
    )
    job = queued_job(team, alice, cluster=cluster)
    now = dt.datetime.now(dt.UTC)
    submitted, ran, ended = (now - dt.timedelta(seconds=s) for s in (100, 70, 10))
    attempt = with_attempt(
        job,
        S.RUNNING,
        job_ref="sf-r1-a1",
        submitted_at=submitted - dt.timedelta(seconds=1),
        start_time=ran,
        alive_at=ended + dt.timedelta(seconds=2),
    )
    done = ray_job("SUCCEEDED", start_time=_ms(submitted), end_time=_ms(ended))
    monkeypatch.setattr(RayExecutor, "_list_jobs", lambda self: [done])
    reconcile_all()
    attempt.refresh_from_db()
    assert Job.objects.get(pk=job.pk).status == S.SUCCEEDED
    assert (attempt.engine_start, attempt.engine_end) == (_at_ms(submitted), _at_ms(ended))
    assert (attempt.start_time, attempt.end_time) == (ran, _at_ms(ended))


def _ms(at: dt.datetime) -> int:
    return int(at.timestamp() * 1000)


def _at_ms(at: dt.datetime) -> dt.datetime:
    """`at` as Ray keeps it: whole milliseconds."""
    return dt.datetime.fromtimestamp(_ms(at) / 1000, dt.UTC)


def test_a_pending_job_carries_rays_words():
    obs = observe(ray_job("PENDING", entrypoint_num_gpus=8))
    assert obs.message.startswith("Job has not started yet. It may be waiting for resources")


@pytest.mark.django_db
def test_an_unknown_ray_status_leaves_the_job_as_it_is_and_is_recorded(monkeypatch, team, alice):
    cluster = Cluster.objects.create(
        name="ray", kind="ray", settings={"address": "http://127.0.0.1:9"}
    )
    job = queued_job(team, alice, cluster=cluster)
    with_attempt(job, S.RUNNING, job_ref="sf-r1-a1", start_time=dt.datetime.now(dt.UTC))
    made_up = {"submission_id": "sf-r1-a1", "status": "DRAINING", "message": "node draining"}
    monkeypatch.setattr(RayExecutor, "_list_jobs", lambda self: [made_up])
    reconcile_all()
    reconcile_all()
    assert Job.objects.get(pk=job.pk).status == S.RUNNING
    notes = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.OBSERVATION)
    assert [(n.data["native_state"], n.data["message"]) for n in notes] == [
        ("DRAINING", "node draining")
    ]
