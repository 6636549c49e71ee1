"""MLflow's official client against a live Starforge, for the tests that drive it: a script run
by the job environment's Python (`job_python`), with a tracking URI and a token, its JSON
answer read back; and a job's attempt with its tracking token."""

import json
import subprocess
from pathlib import Path

from sf.contract import TRACKING_PATH, tracking_token

from jobs.job_tokens import job_token


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
