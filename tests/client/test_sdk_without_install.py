"""`sf.log` needs no install (issue 49, point 3): a job whose own Python has no `sf` (the job
environment of `make jobenv`) imports the runner's copy, last on its PYTHONPATH, and its points
reach the metrics ingest; a job with an `sf` module of its own keeps its own."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from tests.client.helpers import pack, run_runner, runner_env

LOGS = """
import sf
sf.log({"loss": 0.25}, step=3)
sf.log_validation({"accuracy": 0.75}, step=3)
print("sf from", sf.__file__)
"""


def run_job(fake_api: Any, tmp_path: Path, files: dict[str, str], argv: list[str]):
    sha, data = pack(tmp_path, files)
    points: list[dict] = []

    def metrics(request):
        points.extend(request.json()["points"])
        return 200, {"stored": len(request.json()["points"])}

    fake_api.route("GET /api/v1/ingest/snapshot", lambda r: (200, data))
    fake_api.route("POST /api/v1/ingest/metrics", metrics)
    env = runner_env(tmp_path, fake_api.url, sha, argv)
    result = run_runner(env)
    assert result.returncode == 0, result.stderr
    return env, result, [p for p in points if p["kind"] != "system"]


def test_a_job_python_without_sf_imports_the_runners_copy_and_logs(
    fake_api: Any, tmp_path: Path, job_python: Path
):
    has_sf = subprocess.run([str(job_python), "-c", "import sf"], capture_output=True, check=False)
    assert has_sf.returncode != 0  # the job's environment has no sf of its own
    env, result, points = run_job(fake_api, tmp_path, {"job.py": LOGS}, [str(job_python), "job.py"])
    sdk = Path(env["SF_EXIT_FILE"]).parent / "sdk"
    assert f"sf from {sdk}/sf/__init__.py" in result.stdout
    assert [(p["kind"], p["name"], p["step"], p["value"]) for p in points] == [
        ("train", "loss", 3, 0.25),
        ("validation", "accuracy", 3, 0.75),
    ]
    # Only the sf package is there, and nobody but the runner may change it.
    assert sorted(os.listdir(sdk)) == ["sf"]
    for path in [sdk, *sdk.rglob("*")]:
        assert not path.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH), path
        assert path.stat().st_mode & stat.S_IROTH, path


def test_a_job_with_an_sf_of_its_own_keeps_its_own(fake_api: Any, tmp_path: Path, job_python):
    own = "def log(metrics, step=None):\n    print('own sf', metrics)\n"
    files = {"job.py": "import sf\nsf.log({'x': 1})\n", "sf.py": own}
    _env, result, points = run_job(fake_api, tmp_path, files, [str(job_python), "job.py"])
    assert "own sf {'x': 1}" in result.stdout and points == []
