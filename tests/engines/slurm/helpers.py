"""What the Slurm suites share: a runner job's LaunchSpec (offline: no API, no snapshot), waiting
for a Slurm job's state, its attempt directory, and a fake command runner for Slurm's answers."""

import json
import subprocess
import time
from pathlib import Path

from jobs.executors import LaunchSpec, Observation
from jobs.executors.slurm import SlurmExecutor

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


def python_spec(token: str, label: str, code: str, total_gpus: int = 0, **env: str) -> LaunchSpec:
    """A runner job whose entrypoint is `python -c code` (offline runner: no API, no snapshot)."""
    env = {
        "SF_API_URL": "",
        "SF_SNAPSHOT": "",
        "SF_ENTRYPOINT": json.dumps(["python", "-c", code]),
        **env,
    }
    run_id = f"{token}{label}"
    return LaunchSpec(
        name=f"sf-{run_id}-a1",
        job_id=1,
        run_id=run_id,
        attempt=1,
        total_gpus=total_gpus,
        entrypoint=["python", "-c", code],
        env=env,
    )


def wait_for(executor, ref: str, states: set[str], timeout: float = 20) -> list[Observation]:
    """Poll until the job reaches one of `states`; every observation on the way."""
    seen: list[Observation] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        obs = executor.poll([ref]).get(ref)
        if obs is not None:
            seen.append(obs)
            if obs.native_state in states:
                return seen
        time.sleep(0.1)
    last = seen[-1].native_state if seen else "nothing"
    raise AssertionError(f"job {ref} did not reach {sorted(states)} in {timeout} s ({last})")


def attempt_dir(executor: SlurmExecutor, spec: LaunchSpec) -> Path:
    return executor.work_dir / spec.name


class FakeSlurm:
    """Stands in for the Slurm commands: canned output per command, every call recorded."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, str, str]] = {}
        self.calls: list[list[str]] = []

    def answer(self, command: str, stdout: str = "", rc: int = 0, stderr: str = "") -> None:
        self.answers[command] = (rc, stdout, stderr)

    def __call__(self, argv, env, fds):
        self.calls.append(argv)
        rc, out, err = self.answers.get(argv[0], (0, "", ""))
        return subprocess.CompletedProcess(argv, rc, out, err)
