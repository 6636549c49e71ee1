"""A sandboxed local job reaches the MLflow tracking endpoint through the runner's forwarder
(issue 49, point 1), and nothing else of the server: run as root, a real job in its sandbox
POSTs to its MLFLOW_TRACKING_URI (the stand-in routes of `tests.executors.mlflow_standin` echo
what arrived, credential included), is answered an MLflow-shaped 404 for /api/v1 through the
same forwarder, and still cannot reach the server on the host's loopback directly."""

import json
import os
import sys
from urllib.parse import urlparse

import pytest
from sf.contract import tracking_token

from jobs.job_tokens import job_token_for
from jobs.models import Job
from tests.factories import queued_job
from tests.local_jobs import finished, run_until, start, texts

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("local_jobs"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs the server to run as root"),
]

TRACKING_JOB = """
import json, os, socket, sys, urllib.error, urllib.request
uri = os.environ["MLFLOW_TRACKING_URI"]
token = os.environ["MLFLOW_TRACKING_TOKEN"]
out = {"uri": uri, "token": token}
def call(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
out["tracking"] = call(uri + "/api/2.0/mlflow/runs/log-batch", {"metrics": [{"key": "loss"}]})
out["api"] = call(uri.removesuffix("/mlflow") + "/api/v1/jobs")
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    out["direct"] = "reached"
except OSError as exc:
    out["direct"] = type(exc).__name__
print(json.dumps(out), flush=True)
"""


def run_job(team, user, code: str, *args: str) -> tuple[Job, dict]:
    job = queued_job(team, user, total_gpus=0, entrypoint=[sys.executable, "-c", code, *args])
    start(job)
    run_until(lambda: finished(job), timeout=60)
    job.refresh_from_db()
    assert job.status == "SUCCEEDED", (job.status_reason, texts(job))
    return job, json.loads(texts(job)[-1])


def test_a_sandboxed_job_reaches_the_tracking_endpoint_and_nothing_else_of_the_server(
    settings, live_server, team, alice
):
    settings.ROOT_URLCONF = "tests.executors.mlflow_standin"
    port = str(urlparse(live_server.url).port)
    job, seen = run_job(team, alice, TRACKING_JOB, port)
    assert urlparse(seen["uri"]).hostname == "127.0.0.1"  # the forwarder, inside the sandbox
    assert urlparse(seen["uri"]).path == "/mlflow"
    assert seen["token"] == tracking_token(job_token_for(job.current_attempt))
    status, echoed = seen["tracking"]
    assert status == 200
    assert echoed == {
        "method": "POST",
        "path": "/mlflow/api/2.0/mlflow/runs/log-batch",
        "authorization": f"Bearer {seen['token']}",
        "body": {"metrics": [{"key": "loss"}]},
    }
    status, refused = seen["api"]
    assert status == 404 and refused["error_code"] == "ENDPOINT_NOT_FOUND"
    assert seen["direct"] != "reached"
