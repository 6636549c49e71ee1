"""MLflow's official client, unchanged, in a job on the real Ray head: the job environment's
`mlflow` (`make jobenv`) logs into the attempt's run through the MLFLOW_TRACKING_URI and
MLFLOW_TRACKING_TOKEN the runner gave it after spending its bootstrap credential, the API's
own address, which the runner reports to. Its metrics reach the job's Charts, its params and
tags the run `<job>-1`, as a member reads them (issue 49, point 1)."""

import json
import socket
import sys
import time
import uuid

import pytest
from sf.contract import TRACKING_PATH

from jobs.actions.tokens import issue_token
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Cluster, Job, Team
from jobs.states import JobStatus
from jobs.stores import logstore
from tests.conftest import ApiClient
from tests.factories import queued_job
from tests.mlflow_calls import QUICK_CLIENT, RANK_LOGGING, check_ranks_logged, said

pytestmark = [pytest.mark.ray, pytest.mark.django_db(transaction=True)]


def test_a_ray_job_logs_into_its_attempts_run_with_mlflows_own_client(
    ray_address, shared_ledger, live_server, settings, tmp_path, make_user, job_python
):
    settings.SF_API_URL = live_server.url  # the address the runner (and its job) reach
    settings.SF_RUNNER_PYTHON = sys.executable
    cluster = Cluster.objects.create(
        name="ray",
        kind="ray",
        settings={"address": ray_address, "work_dir": str(tmp_path / "ray-work")},
    )
    team = Team.objects.create(name="vision", gpu_quota=8, default_cluster=cluster)
    user = make_user("alice", team)
    job = queued_job(
        team, user, total_gpus=0, entrypoint=[str(job_python), "-c", RANK_LOGGING], env=QUICK_CLIENT
    )
    # Ray keeps every submission id: one no earlier session used
    Job.objects.filter(pk=job.pk).update(run_id=f"t{uuid.uuid4().hex[:12]}")

    deadline = time.monotonic() + 120
    while job.status not in JobStatus.terminal():
        assert time.monotonic() < deadline, f"job still {job.status}: {job.status_reason}"
        launch_attempts(admit_queued_jobs().admitted)
        reconcile_all()
        time.sleep(0.3)
        job.refresh_from_db()

    texts = [json.loads(raw)["text"] for raw in logstore.read(job.pk, None, 1000).raw_lines]
    assert job.status == JobStatus.SUCCEEDED, (job.status_reason, texts)
    assert said(texts) == [f"tracking {live_server.url}{TRACKING_PATH}", f"run {job.pk}-1"]
    here = socket.gethostname()  # the Ray head's one node is this host
    check_ranks_logged(
        ApiClient(user), job, {0: here}, job_python, live_server.url, issue_token(user)
    )
