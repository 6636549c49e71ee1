"""Launch workers on different hosts, all launching the same attempts at once on a real Slurm:
one Slurm job per attempt. Each executor gets a work_dir of its own (no disk shared between
the workers, so no lock file or attempt dir keeps them apart): only the ledger's claim does.
"""

import uuid

import pytest

from jobs.executors.slurm import SlurmExecutor
from jobs.models import Attempt, Cluster, Job
from jobs.states import JobStatus
from tests.engines.slurm.conftest import slurm
from tests.factories import queued_job, with_attempt
from tests.launching import launch_at_once

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]
WORKERS = 4
ATTEMPTS = 8


@pytest.fixture
def own_disk_per_executor(monkeypatch):
    init = SlurmExecutor.__init__

    def on_a_disk_of_its_own(self, cluster, run=None):
        init(self, cluster, run)
        self.work_dir = self.work_dir / uuid.uuid4().hex

    monkeypatch.setattr(SlurmExecutor, "__init__", on_a_disk_of_its_own)


def test_workers_launching_the_same_attempts_at_once_make_one_slurm_job_each(
    make_team, make_user, cluster_settings, slurm_conf, token, settings, own_disk_per_executor
):
    settings.SF_API_URL = ""  # offline runners
    cluster = Cluster.objects.create(name="hpc", kind="slurm", settings=cluster_settings)
    team = make_team("physics", gpu_quota=8, cluster=cluster)
    user = make_user("bob", team)
    attempt_ids = []
    for i in range(ATTEMPTS):
        job = queued_job(
            team, user, total_gpus=0, entrypoint=["python", "-c", "import time; time.sleep(60)"]
        )
        Job.objects.filter(pk=job.pk).update(run_id=f"{token}{i}")  # cleaned up by its name
        job.refresh_from_db()
        attempt_ids.append(with_attempt(job, JobStatus.SUBMITTED).pk)
    errors = [o.error for o in launch_at_once(attempt_ids, WORKERS) if o.error]
    assert errors == []
    for attempt in Attempt.objects.filter(pk__in=attempt_ids):
        listed = slurm(
            "squeue", "-h", "-t", "all", "-n", attempt.backend_name, "-o", "%i", conf=slurm_conf
        )
        assert listed.split() == [attempt.job_ref], attempt.backend_name
    assert Job.objects.filter(status=JobStatus.PENDING).count() == ATTEMPTS
