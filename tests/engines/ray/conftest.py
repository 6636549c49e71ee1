"""A real single-node Ray head for the Ray executor's tests, and helpers to run jobs on it.

`.ci/ray.sh up` starts Ray (4 logical GPUs, RAY_JOB_START_TIMEOUT_SECONDS=30) unless one already
answers; the session stops it at the end only if it started it. Jobs run the real job-side
runner offline (no API URL, no snapshot) unless a test gives it an API.
"""

import importlib.util
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.executors import LaunchSpec, Observation
from jobs.executors.ray import RayExecutor
from jobs.models import Cluster

ROOT = Path(__file__).resolve().parents[3]
RAY_SH = ROOT / ".ci" / "ray.sh"
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


@pytest.fixture(scope="session", autouse=True)
def _ray_installed() -> None:
    """These tests need the ray package (the parity test imports it): missing is a failure."""
    if importlib.util.find_spec("ray") is None:
        pytest.fail(
            "ray is not installed in this Python: run `make engines` "
            "(pip install -r requirements-engines.txt) before the Ray suite",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """The dashboard URL of a running Ray head, started by `.ci/ray.sh up` when needed."""
    up = subprocess.run([RAY_SH, "up"], capture_output=True, text=True, timeout=180)
    if up.returncode:
        pytest.fail(f".ci/ray.sh up failed:\n{up.stdout}{up.stderr}", pytrace=False)
    started = up.stdout.startswith("ray up")
    url = subprocess.run([RAY_SH, "url"], capture_output=True, text=True, check=True).stdout
    yield url.strip()
    if started:
        subprocess.run([RAY_SH, "down"], capture_output=True, text=True, timeout=60)


@pytest.fixture
def ray_cluster(ray_address, tmp_path) -> Cluster:
    """A ray-kind cluster (not saved: the executor needs only its name and settings)."""
    settings = {"address": ray_address, "work_dir": str(tmp_path / "ray-work")}
    return Cluster(name="ray-ci", kind="ray", settings=settings)


class RayJobs:
    """Submits offline runner jobs through the executor, waits on them, and stops leftovers."""

    def __init__(self, executor: RayExecutor, tmp_path: Path) -> None:
        self.executor = executor
        self.tmp_path = tmp_path
        self.names: list[str] = []

    def spec(self, argv: list[str], total_gpus: int = 1, **env: str) -> LaunchSpec:
        run_id = f"t{uuid.uuid4().hex[:10]}"
        name = f"sf-{run_id}-a1"
        output = self.tmp_path / "runs" / run_id
        base = {
            "SF_API_URL": "",
            "SF_SNAPSHOT": "",
            "SF_RUN_ID": run_id,
            "SF_ATTEMPT": "1",
            "SF_OUTPUT_DIR": str(output),
            "SF_CHECKPOINT_DIR": str(output / "checkpoints"),
            "SF_ENTRYPOINT": json.dumps(argv),
        }
        return LaunchSpec(
            name=name,
            job_id=0,
            run_id=run_id,
            attempt=1,
            total_gpus=total_gpus,
            entrypoint=argv,
            env={**base, **env},
            team="vision",
        )

    def submit(self, argv: list[str], total_gpus: int = 1, **env: str) -> LaunchSpec:
        spec = self.spec(argv, total_gpus, **env)
        self.names.append(spec.name)
        assert self.executor.submit(spec) == spec.name
        return spec

    def wait(self, name: str, until: set[str], timeout: float = 60) -> tuple[Observation, list]:
        """Poll until the job's Ray status is in `until`; return it and the statuses seen."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            obs = self.executor.poll([name]).get(name)
            state = obs.native_state if obs else "<absent>"
            if not seen or seen[-1] != state:
                seen.append(state)
            if obs and state in until:
                return obs, seen
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not reach {until} in {timeout} s; saw {seen}")
            time.sleep(0.2)

    def attempt_dir(self, name: str) -> Path:
        return Path(str(self.executor.work_dir)) / name

    def stop_leftovers(self) -> None:
        if not self.names:
            return
        for name, obs in self.executor.poll(self.names).items():
            if obs.native_state not in TERMINAL:
                self.executor.cancel(name)


@pytest.fixture
def ray_jobs(ray_cluster, tmp_path) -> Iterator[RayJobs]:
    jobs = RayJobs(RayExecutor(ray_cluster), tmp_path)
    yield jobs
    jobs.stop_leftovers()
