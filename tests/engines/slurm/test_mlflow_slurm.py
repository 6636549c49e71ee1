"""MLflow's official client, unchanged, in both ranks of a job on the real two-node Slurm (the
`multi` partition of `.ci/slurm.sh`: multi1 and multi2, a slurmd each on this host): the job
environment's `mlflow` (`make jobenv`) in each srun step logs into the attempt's run through
the MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN the runner gave every rank, the API's own
address, which the runner reports to. Both ranks' metrics reach the job's Charts, their params
and tags the run `<job>-1`, as a member reads them (issue 49, point 1)."""

import json
import sys
import time

import pytest
from sf.contract import TRACKING_PATH

from jobs.actions.tokens import issue_token
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Cluster, Job
from jobs.states import JobStatus
from jobs.stores import logstore
from tests.conftest import ApiClient
from tests.factories import queued_job
from tests.mlflow_calls import QUICK_CLIENT, RANK_LOGGING, check_ranks_logged, said

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]
MULTI = {"multi1", "multi2"}


def lines_by_rank(job: Job) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for raw in logstore.read(job.pk, None, 10_000).raw_lines:
        line = json.loads(raw)
        out.setdefault(line.get("rank", -1), []).append(line["text"])
    return out


def test_every_rank_logs_into_the_attempts_run_with_mlflows_own_client(
    live_server, settings, cluster_settings, token, idle_gpus, make_team, make_user, job_python
):
    settings.SF_API_URL = live_server.url  # the address the runner (and its ranks) reach
    settings.SF_RUNNER_PYTHON = sys.executable
    cluster = Cluster.objects.create(
        name=f"multi-{token}", kind="slurm", settings={**cluster_settings, "partition": "multi"}
    )
    team = make_team("vision", gpu_quota=8, cluster=cluster)
    user = make_user("bob", team)
    job = queued_job(
        team, user, total_gpus=0, nodes=2, entrypoint=[str(job_python), "-c", RANK_LOGGING],
        env=QUICK_CLIENT,
    )  # fmt: skip
    # the test's token in the run_id names its Slurm jobs (sf-<run_id>-a1): cancelled after
    Job.objects.filter(pk=job.pk).update(run_id=f"{token}mlflow")

    deadline = time.monotonic() + 120
    while job.status not in JobStatus.terminal():
        assert time.monotonic() < deadline, f"job still {job.status}: {lines_by_rank(job)}"
        launch_attempts(admit_queued_jobs().admitted)
        reconcile_all()
        time.sleep(0.5)
        job.refresh_from_db()

    lines = lines_by_rank(job)
    assert job.status == JobStatus.SUCCEEDED, (job.status_reason, lines)
    ranks = Attempt.objects.get(job=job, number=1).ranks
    nodes = {r["rank"]: r["node"] for r in ranks}
    assert sorted(nodes) == [0, 1] and set(nodes.values()) == MULTI, ranks  # a rank per node
    for rank in (0, 1):
        assert said(lines[rank]) == [
            f"tracking {live_server.url}{TRACKING_PATH}",
            f"run {job.pk}-1",
        ], lines
    check_ranks_logged(ApiClient(user), job, nodes, job_python, live_server.url, issue_token(user))
