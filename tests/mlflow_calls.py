"""MLflow's official client against a live Starforge, for the tests that drive it: a script run
by the job environment's Python (`job_python`), with a tracking URI and a token, its JSON
answer read back; a job's attempt with its tracking token; and what the ranks of a job on an
engine log with it (`RANK_LOGGING`, `check_ranks_logged`)."""

import json
import subprocess
from pathlib import Path

import pytest
from sf.contract import TRACKING_PATH, tracking_token

from jobs.job_tokens import job_token
from jobs.models import Job


def token_of(job_id: int, attempt: int = 1) -> str:
    """The attempt's tracking token, as the runner derives it from its job token."""
    return tracking_token(job_token(job_id, attempt))


def run_client(python: Path, server_url: str, token: str, script: str, timeout: float = 120):
    """Run `script` under the job environment's Python with MLflow pointed at the server; the
    JSON it printed last, or AssertionError with its output."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "MLFLOW_TRACKING_URI": f"{server_url}{TRACKING_PATH}",
        "MLFLOW_TRACKING_TOKEN": token,
        # A refusal is the answer under test: MLflow's client would retry a 429 for minutes.
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    }
    done = subprocess.run(
        [str(python), "-c", script], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"client failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


# Every rank of a job on an engine, as unchanged training code would: the run (the attempt's),
# a param all ranks share and one of its own (its node: Slurm's name for it, else its host
# name), a metric of its own at STEPS steps, a tag, the end. It prints the URI it was given
# and the run it got.
STEPS = 5
RANK_LOGGING = f"""
import os, socket, mlflow
rank = int(os.environ.get("NODE_RANK", "0"))
node = os.environ.get("SLURMD_NODENAME") or os.environ.get("HOSTNAME") or socket.gethostname()
print("tracking", os.environ["MLFLOW_TRACKING_URI"], flush=True)
run = mlflow.start_run()
mlflow.log_param("lr", 0.1)
mlflow.log_param(f"node_rank{{rank}}", node)
for step in range({STEPS}):
    mlflow.log_metric(f"loss_rank{{rank}}", (rank + 1) / (step + 1), step=step)
mlflow.set_tag(f"rank{{rank}}", "done")
mlflow.end_run()
print("run", run.info.run_id, flush=True)
"""
# A job's MLflow client fails fast where the endpoint cannot be reached or refuses it: it would
# retry for minutes by default.
QUICK_CLIENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}

READ_RUN = """
import json
from mlflow import MlflowClient
run = MlflowClient().get_run("{run_id}")
print(json.dumps({{"params": run.data.params, "tags": run.data.tags, "status": run.info.status}}))
"""


def said(texts: list[str]) -> list[str]:
    """RANK_LOGGING's own lines of a rank's output (MLflow's client adds its own)."""
    return [t for t in texts if t.startswith(("tracking ", "run "))]


def rank_losses(rank: int) -> list[float]:
    """What RANK_LOGGING's rank logs as its loss, step by step."""
    return [(rank + 1) / (step + 1) for step in range(STEPS)]


def check_ranks_logged(
    api, job: Job, nodes: dict[int, str], python: Path, server_url: str, user_token: str
) -> None:
    """What RANK_LOGGING's ranks (`nodes`: rank -> the node it names, where it ran) logged
    reached attempt 1 of `job`: each rank's loss in the Charts' train series (`api`: a member's
    ApiClient), the params and tags on the run `<job>-1` as a member's MLflow client reads it."""
    run_id = f"{job.pk}-1"
    answer = api.get(f"/jobs/{job.pk}/metrics", kind="train")
    assert answer.status_code == 200, answer.content
    series = answer.json()["series"]
    assert sorted(series) == [f"loss_rank{rank}" for rank in sorted(nodes)], series
    for rank in nodes:
        loss = series[f"loss_rank{rank}"]
        assert loss["x"] == list(range(STEPS)), series
        assert loss["y"] == pytest.approx(rank_losses(rank)), series
    run = read_run(python, server_url, user_token, run_id)
    params = {"lr": "0.1", **{f"node_rank{rank}": node for rank, node in nodes.items()}}
    assert run["params"] == params, run
    assert {k: v for k, v in run["tags"].items() if k.startswith("rank")} == {
        f"rank{rank}": "done" for rank in nodes
    }, run
    assert run["status"] == "FINISHED", run  # the ledger's: the job SUCCEEDED


def read_run(python: Path, server_url: str, user_token: str, run_id: str) -> dict:
    """The run as a member's MLflow client reads it: params, tags, status."""
    return run_client(python, server_url, user_token, READ_RUN.format(run_id=run_id))
