"""A hang's retry on a real two-node Slurm keeps off the node that hung (issue 50, point 3): a
job on the `multi` partition (multi1, multi2: `.ci/slurm.sh`) waits forever, its runner
reports no progress to the live server, the team's hang policy (`hang_action=fail`) fails it
as hung, and its automatic retry is submitted with `--exclude` of that node, so Slurm runs it
on the other one. The attempts keep the node each ran on, as Slurm's NodeList said."""

import sys
import time

import pytest
from django.utils import timezone

from jobs.actions import control
from jobs.loops.activity import watch_activity
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import ActivityPolicy, Attempt, Cluster, Job, JobEvent
from jobs.states import JobStatus
from tests.engines.slurm.conftest import slurm
from tests.factories import queued_job

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]
S = JobStatus
MULTI = {"multi1", "multi2"}
HANGS = """
import time

def wait_for_the_other_side():
    while True:
        time.sleep(0.5)

print("ready", flush=True)
wait_for_the_other_side()
"""


def node_of(attempt: Attempt) -> str:
    (rank,) = attempt.ranks
    return rank["node"]


def tick_until(predicate, timeout: float = 120.0):
    """The loops' ticks, as beat runs them (admit, launch, reconcile, watch), until
    `predicate()` answers something."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        launch_attempts(admit_queued_jobs().admitted)
        reconcile_all()
        watch_activity(timezone.now())
        if found := predicate():
            return found
        time.sleep(0.5)
    raise AssertionError("condition not reached in time")


def test_a_job_that_hung_on_one_node_is_retried_on_the_other(
    live_server, settings, slurm_conf, cluster_settings, token, idle_gpus, make_team, make_user
):
    settings.SF_API_URL = live_server.url  # the runner reports its activity there
    settings.SF_RUNNER_PYTHON = sys.executable
    cluster = Cluster.objects.create(
        name=f"multi-{token}", kind="slurm", settings={**cluster_settings, "partition": "multi"}
    )
    team = make_team("vision", gpu_quota=8, cluster=cluster)
    user = make_user("bob", team)
    ActivityPolicy.objects.create(team=team, hang_after_s=3, hang_action="fail")
    job = queued_job(
        team, user, total_gpus=1, entrypoint=["python", "-c", HANGS],
        env={"SF_SYSTEM_SAMPLE_S": "0.3"}, max_retries=1, retry_cooldown_s=0,
    )  # fmt: skip
    # the test's token in the run_id names its Slurm jobs (sf-<run_id>-aN): cancelled after
    Job.objects.filter(pk=job.pk).update(run_id=f"{token}hung")

    def retry_running() -> Attempt | None:
        retry = Attempt.objects.filter(job=job, number=2).first()
        return retry if retry is not None and retry.ranks else None

    retry = tick_until(retry_running)
    first = Attempt.objects.get(job=job, number=1)
    assert first.failure == "hung", first.end_reason
    assert node_of(first) in MULTI and node_of(retry) in MULTI
    assert node_of(retry) != node_of(first)
    job.refresh_from_db()
    assert job.avoid_nodes == [node_of(first)]
    (note,) = JobEvent.objects.filter(job=job, reason__startswith="its retries avoid")
    assert note.reason.startswith(f"its retries avoid node {node_of(first)}, which hung attempt 1")
    retry_ref = retry.job_ref
    control.stop_job(user, job.pk)  # after commit (autocommit here): scancel
    deadline = time.monotonic() + 20
    while slurm("squeue", "-h", "-j", retry_ref, "-o", "%T", conf=slurm_conf, check=False).strip():
        assert time.monotonic() < deadline, "the retry's Slurm job outlived its stop"
        time.sleep(0.2)
