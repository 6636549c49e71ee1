"""Starforge's MLflow endpoint against a real MLflow tracking server (issue 49, point 5).

Both servers run on this machine in the same run: `mlflow server` from .venv-mlflow (`make
.venv-mlflow/.installed`) with its default SQLite backend, and Starforge's web server
(`starforge.serving`, SF_WEB_WORKERS granian workers) on this child's PostgreSQL. Against each:
- the real client (the job environment's mlflow, .venv-jobs, in a subprocess) logs
  CLIENT_POINTS points of one metric with `MlflowClient.log_batch`: end to end, where the
  client's own work (about 60 ms per 1,000 metrics on these cores to build and serialize the
  protobufs) is most of the time on both sides;
- the servers' ingest alone: the same requests the client sends (`runs/log-batch`, 1,000
  metrics each, the body `requests` writes for the client's `json=`, built before the clock
  starts), replayed over one keep-alive connection, SERVER_POINTS points to Starforge and
  MLFLOW_POINTS to MLflow (its SQLite ingest is the slow side; points/s is the figure);
- `get_metric_history` of that metric: the raw pages the client asks for (25,000 points each)
  timed over HTTP, the first page and the whole history, and the real client's call.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

ROOT = Path(__file__).resolve().parent.parent
MLFLOW = ROOT / ".venv-mlflow" / "bin" / "mlflow"
JOB_PYTHON = ROOT / ".venv-jobs" / "bin" / "python"
SERVER_POINTS = 1_000_000
MLFLOW_POINTS = 100_000
CLIENT_POINTS = 50_000
BATCH = 1000
PAGE = 25_000
JSON = {"Content-Type": "application/json"}

CLIENT_LOG = """
import json, sys, time
from mlflow import MlflowClient
from mlflow.entities import Metric
n, experiment = int(sys.argv[1]), sys.argv[2]
c = MlflowClient()
run = c.create_run(experiment).info.run_id
metrics = [Metric("client_loss", 1.0 / (i + 1), 1700000000000 + i, i) for i in range(n)]
t = time.perf_counter()
c.log_batch(run, metrics=metrics)
print(json.dumps({"run_id": run, "log_s": time.perf_counter() - t}))
"""

CLIENT_HISTORY = """
import json, sys, time
from mlflow import MlflowClient
t = time.perf_counter()
got = len(MlflowClient().get_metric_history(sys.argv[1], "loss"))
print(json.dumps({"history_s": time.perf_counter() - t, "history_points": got}))
"""


def run() -> dict:
    """For bench/run.py: the database is created and migrated, Django set up."""
    for needed, how in ((MLFLOW, "make .venv-mlflow/.installed"), (JOB_PYTHON, "make jobenv")):
        if not needed.exists():
            raise SystemExit(f"{needed} is missing: run `{how}`")
    work = Path(tempfile.mkdtemp(prefix="sf-bench-mlflow-"))
    seeded = _seed()
    starforge_port, mlflow_port = common.free_port(), common.free_port()
    with _servers(work, starforge_port, mlflow_port):
        starforge = _side(f"http://127.0.0.1:{starforge_port}/mlflow", seeded, SERVER_POINTS)
        print(json.dumps({"starforge": starforge}), file=sys.stderr, flush=True)
        peer = _side(f"http://127.0.0.1:{mlflow_port}", None, MLFLOW_POINTS)
    return {
        "starforge": starforge,
        "mlflow": peer,
        "ingest_ratio": starforge["server_points_per_s"] / peer["server_points_per_s"],
        "client_ingest_ratio": starforge["client_points_per_s"] / peer["client_points_per_s"],
    }


def _seed() -> dict:
    from sf.contract import tracking_token

    from jobs.actions.tokens import issue_token
    from jobs.job_tokens import job_token

    user = common.make_user()
    cluster = common.make_cluster(8)
    (team,) = common.make_teams(1, 8, cluster, user)
    job = common.running_job(team, user, cluster, "mlflow-bench")
    return {
        "token": tracking_token(job_token(job.pk, 1)),
        "reader": issue_token(user),
        "run_id": f"{job.pk}-1",
    }


class _servers:
    def __init__(self, work: Path, starforge_port: int, mlflow_port: int) -> None:
        from starforge.serving import web_server_argv

        env = {**os.environ, "SF_DEBUG": "0", "PYTHONUNBUFFERED": "1"}
        self.started = [
            (web_server_argv("127.0.0.1", starforge_port, 2), env, ROOT, starforge_port),
            (
                [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(mlflow_port)],
                {"PATH": os.environ["PATH"], "HOME": str(work)},
                work,
                mlflow_port,
            ),
        ]
        self.work, self.procs = work, []

    def __enter__(self) -> _servers:
        for i, (argv, env, cwd, port) in enumerate(self.started):
            log = open(self.work / f"server-{i}.log", "w")  # noqa: SIM115 (closed with the run)
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
            self.procs.append(proc)
            common.wait_for_port(port, 120, lambda p=proc: p.poll() is None)
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _side(root: str, seeded: dict | None, points: int) -> dict:
    """One server's figures: the real client's ingest and history, its raw ingest and pages."""
    token = seeded["token"] if seeded else ""
    host, _, prefix = root.removeprefix("http://").partition("/")
    prefix = f"/{prefix}" if prefix else ""
    experiment = "0" if seeded else _mlflow_experiment(host)
    client = _client(root, token, CLIENT_LOG, str(CLIENT_POINTS), experiment)
    run_id = seeded["run_id"] if seeded else _mlflow_run(host, experiment)
    conn = http.client.HTTPConnection(host, timeout=600)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    bodies = [_batch(run_id, first) for first in range(0, points, BATCH)]  # the client's work
    started = time.perf_counter()
    for body in bodies:
        _call(conn, "POST", f"{prefix}/api/2.0/mlflow/runs/log-batch", body, headers)
    ingest_s = time.perf_counter() - started
    if seeded:  # a member reads; the job's tracking token may not
        headers["Authorization"] = f"Bearer {seeded['reader']}"
    pages, total = _history(conn, prefix, headers, run_id)
    whole = _client(root, seeded["reader"] if seeded else "", CLIENT_HISTORY, run_id)
    return {
        "server_points": points,
        "server_points_per_s": points / ingest_s,
        "client_points": CLIENT_POINTS,
        "client_points_per_s": CLIENT_POINTS / client["log_s"],
        "history_first_page_ms": pages[0] * 1000,
        "history_page_ms": common.summary_ms(pages),
        "history_all_pages_ms": total * 1000,
        "history_client_s": whole["history_s"],
        "history_client_points": whole["history_points"],
    }


def _batch(run_id: str, first: int) -> str:
    """The body of one `log_batch` request, as the client writes it: BATCH points of `loss`."""
    metrics = [
        {"key": "loss", "value": 1.0 / (i + 1), "timestamp": 1700000000000 + i, "step": i}
        for i in range(first, first + BATCH)
    ]
    return json.dumps({"run_id": run_id, "metrics": metrics})


def _history(conn, prefix: str, headers: dict, run_id: str) -> tuple[list[float], float]:
    pages, token, started = [], "", time.perf_counter()
    while True:
        query = f"run_id={run_id}&metric_key=loss&max_results={PAGE}"
        query += f"&page_token={token}" if token else ""
        t = time.perf_counter()
        body = _call(
            conn, "GET", f"{prefix}/api/2.0/mlflow/metrics/get-history?{query}", None, headers
        )
        pages.append(time.perf_counter() - t)
        token = json.loads(body).get("next_page_token")
        if not token:
            return pages, time.perf_counter() - started


def _call(conn, method: str, path: str, body: str | None, headers: dict) -> bytes:
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{method} {path[:80]}: {response.status} {data[:300]!r}")
    return data


def _mlflow_experiment(host: str) -> str:
    conn = http.client.HTTPConnection(host, timeout=60)
    body = json.dumps({"name": f"bench-{time.time_ns()}"})
    created = _call(conn, "POST", "/api/2.0/mlflow/experiments/create", body, JSON)
    return json.loads(created)["experiment_id"]


def _mlflow_run(host: str, experiment: str) -> str:
    conn = http.client.HTTPConnection(host, timeout=60)
    body = json.dumps({"experiment_id": experiment, "start_time": int(time.time() * 1000)})
    created = _call(conn, "POST", "/api/2.0/mlflow/runs/create", body, JSON)
    return json.loads(created)["run"]["info"]["run_id"]


def _client(root: str, token: str, script: str, *args: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir(), "MLFLOW_TRACKING_URI": root}
    if token:
        env["MLFLOW_TRACKING_TOKEN"] = token
    done = subprocess.run(
        [str(JOB_PYTHON), "-c", script, *args], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode:
        raise RuntimeError(f"the MLflow client failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit("run it through bench/run.py: `.venv/bin/python bench/run.py --only mlflow`")
