"""The ledger on a real Slurm: launcher → sbatch → reconciler ticks → the job's final state.

The runner works offline here (SF_API_URL empty): these tests are about states, exit codes and
times, not about logs reaching the API.
"""

import time

import pytest

from jobs.actions import control
from jobs.executors import executor_for
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.models import Attempt, Cluster, Job, JobEvent
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]
S = JobStatus


@pytest.fixture
def slurm_team(make_team, cluster_settings, settings):
    settings.SF_API_URL = ""  # offline runners: no API server in these tests
    cluster = Cluster.objects.create(name="hpc", kind="slurm", settings=cluster_settings)
    return make_team("physics", gpu_quota=8, cluster=cluster)


@pytest.fixture
def bob(make_user, slurm_team):
    return make_user("bob", slurm_team)


def launched(team, user, token: str, code: str, total_gpus: int = 1) -> Attempt:
    job = queued_job(team, user, total_gpus=total_gpus, entrypoint=["python", "-c", code])
    # the test's token in the run_id names the Slurm job (sf-<run_id>-a1): cleaned up after
    Job.objects.filter(pk=job.pk).update(run_id=f"{token}{total_gpus}")
    job.refresh_from_db()
    attempt = with_attempt(job, S.SUBMITTED)
    [outcome] = launch_attempts([attempt.pk])
    assert outcome.job_ref, outcome.error
    return Attempt.objects.get(pk=attempt.pk)


def reconcile_until(job_id: int, statuses: set[str], timeout: float = 20) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        reconcile_all()
        job = Job.objects.get(pk=job_id)
        if job.status in statuses:
            return job
        assert time.monotonic() < deadline, f"job stayed {job.status}: {job.status_reason}"
        time.sleep(0.2)


def test_a_job_runs_to_success_through_the_ledger(slurm_team, bob, token):
    attempt = launched(slurm_team, bob, token, "print('trained')")
    assert attempt.job_ref.isdigit() and attempt.job.status == S.PENDING
    job = reconcile_until(attempt.job_id, {S.SUCCEEDED, S.FAILED})
    assert job.status == S.SUCCEEDED, job.status_reason
    attempt.refresh_from_db()
    assert attempt.exit_code == 0 and attempt.native_state == "COMPLETED"
    assert attempt.start_time and attempt.end_time and attempt.start_time <= attempt.end_time
    path = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.STATUS).order_by("pk")
    assert list(path.values_list("to_status", flat=True)) == [S.PENDING, S.RUNNING, S.SUCCEEDED]


def test_a_stop_cancels_the_slurm_job_and_the_job_stays_stopped(
    slurm_team, bob, token, django_capture_on_commit_callbacks
):
    attempt = launched(slurm_team, bob, token, "import time; time.sleep(120)", total_gpus=2)
    job = reconcile_until(attempt.job_id, {S.RUNNING})
    with django_capture_on_commit_callbacks(execute=True):  # the cancel runs after commit
        control.stop_job(bob, job.pk)
    executor = executor_for(slurm_team.default_cluster)
    deadline = time.monotonic() + 15
    while (obs := executor.poll([attempt.job_ref])[attempt.job_ref]).native_state != "CANCELLED":
        assert time.monotonic() < deadline, f"the Slurm job is still {obs.native_state}"
        time.sleep(0.2)
    reconcile_all()  # the closed attempt's CANCELLED changes nothing
    job.refresh_from_db()
    assert job.status == S.STOPPED
    assert Attempt.objects.get(pk=attempt.pk).end_time is not None
