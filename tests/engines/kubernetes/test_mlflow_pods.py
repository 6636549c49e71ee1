"""MLflow's official client, unchanged, in both pods of a two-node job on Kubernetes (the API
emulator and the fake kubelet, which runs each pod's real runner on this host): every pod's
runner spends the bootstrap credential for its own rank, and its rank logs into the attempt's
run through the MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN it was given, the API's own
address. Both ranks' metrics reach the job's Charts, their params and tags the run `<job>-1`,
as a member reads them (issue 49, point 1)."""

import socket
import sys
import time

import pytest
from sf.contract import TRACKING_PATH

from jobs.actions.tokens import issue_token
from jobs.executors.kubernetes import KubernetesExecutor
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Cluster
from jobs.states import JobStatus
from tests.factories import queued_job
from tests.mlflow_calls import QUICK_CLIENT, RANK_LOGGING, check_ranks_logged, said

pytestmark = [pytest.mark.kubernetes, pytest.mark.django_db(transaction=True)]


def test_every_pods_rank_logs_into_the_attempts_run_with_mlflows_own_client(
    live_server, settings, use_executor, team, alice, api, k8s_settings, gpu_nodes, job_python
):
    settings.SF_API_URL = live_server.url  # the address every pod's runner reaches
    settings.SF_RUNNER_PYTHON = sys.executable
    cluster = Cluster.objects.create(name="gpu-k8s", kind="kubernetes", settings=k8s_settings)
    use_executor(KubernetesExecutor, cluster)
    job = queued_job(
        team, alice, total_gpus=8, nodes=2, cluster=cluster, env=QUICK_CLIENT,
        entrypoint=[str(job_python), "-c", RANK_LOGGING],
    )  # fmt: skip

    deadline = time.monotonic() + 120
    while job.status not in JobStatus.terminal():
        assert time.monotonic() < deadline, f"job still {job.status}: {job.status_reason}"
        launch_attempts(admit_queued_jobs().admitted)
        reconcile_all()
        time.sleep(0.3)
        job.refresh_from_db()

    assert job.status == JobStatus.SUCCEEDED, job.status_reason
    ref = Attempt.objects.get(job=job, number=1).job_ref
    for rank in (0, 1):  # what each pod's runner wrote of its rank's output
        texts = (gpu_nodes.workdir(ref, index=rank) / "console.log").read_text().splitlines()
        assert said(texts) == [f"tracking {live_server.url}{TRACKING_PATH}", f"run {job.pk}-1"]
    hosts = dict.fromkeys((0, 1), socket.gethostname())  # the fake kubelet's pods run here
    check_ranks_logged(api, job, hosts, job_python, live_server.url, issue_token(alice))
