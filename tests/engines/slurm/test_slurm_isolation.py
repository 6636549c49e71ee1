"""Trust boundaries of the Slurm executor against a real slurmctld + slurmd (issue 12).

A job's environment is an allow-list (docs/ARCHITECTURE.md, invariant 8): nothing of the worker's
process environment reaches it, through the sbatch process or Slurm's `--export` defaults.
"""

import json
import os
import sys
from pathlib import Path

import pytest

from jobs.executors.base import DEFAULT_PATH, GPU_VISIBILITY_VARS
from tests.engines.slurm.helpers import FINAL, attempt_dir, python_spec, wait_for

pytestmark = pytest.mark.slurm
PLANTED = {
    "DATABASE_URL": "postgres://leak",
    "SF_SECRET_KEY": "leak",
    "AWS_SECRET_ACCESS_KEY": "leak",
    # what would make sbatch export the worker's environment, or load a login environment
    "SLURM_EXPORT_ENV": "ALL",
    "SBATCH_EXPORT": "ALL",
    "SBATCH_GET_USER_ENV": "1",
}
# What slurmd and slurmstepd add to every batch job (SLURM_* aside).
SLURM_ADDS = {"ENVIRONMENT", "HOSTNAME", "PWD", "TMPDIR", "SLURMD_NODENAME", "OLDPWD", "SHLVL", "_"}
# What the runner adds for the job's code (client/sf/environment.py, child_env).
RUNNER_ADDS = {
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "SF_METRICS_FILE",
    "SF_NOTICE_FILE",
    "SF_PREEMPT_GRACE_S",
}
DUMP = "import json, os; json.dump(dict(os.environ), open('env.json', 'w'))"


def job_env(executor, spec) -> dict[str, str]:
    ref = executor.submit(spec)
    final = wait_for(executor, ref, FINAL, timeout=30)[-1]
    assert final.native_state == "COMPLETED", final
    return json.loads((attempt_dir(executor, spec) / "work" / "env.json").read_text())


def test_nothing_of_the_workers_environment_reaches_a_job(executor, token, monkeypatch):
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    spec = python_spec(token, "env", DUMP, OWN_VAR="mine", CUDA_VISIBLE_DEVICES="0,1,2,3")
    env = job_env(executor, spec)
    leaked = {k: v for k, v in env.items() if k in PLANTED or "leak" in v}
    assert not leaked
    assert env["OWN_VAR"] == "mine"
    assert not GPU_VISIBILITY_VARS & set(env)  # a 0-GPU job: neither its own nor Slurm's
    assert env["HOME"] == str(attempt_dir(executor, spec) / "work")
    assert env["PATH"] == f"{Path(executor.python).parent}:{DEFAULT_PATH}"
    assert env["LANG"] == "C.UTF-8"
    sent = set(executor._job_env(spec, attempt_dir(executor, spec)))
    foreign = {
        k for k in env if k not in sent | SLURM_ADDS | RUNNER_ADDS and not k.startswith("SLURM_")
    }
    assert not foreign, f"not from the allow-list: {sorted(foreign)}"
    # the worker's own variables (its HOME, its PATH) are not the job's either
    assert env["HOME"] != os.environ.get("HOME")


def test_the_slurm_commands_run_with_a_minimal_environment(executor, monkeypatch):
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    seen: list[dict] = []
    real = executor._run

    def run(argv, env, fds):
        seen.append(dict(env))
        return real(argv, env, fds)

    executor._run = run
    executor.capacity()
    assert seen and all(set(env) <= {"PATH", "SLURM_TIME_FORMAT", "SLURM_CONF"} for env in seen)


def test_a_gpu_job_sees_only_the_gpus_slurm_gave_it(executor, token, idle_gpus):
    spec = python_spec(token, "gpu1", DUMP, total_gpus=1, NVIDIA_VISIBLE_DEVICES="all")
    env = job_env(executor, spec)
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "NVIDIA_VISIBLE_DEVICES" not in env


def test_a_configured_home_and_path(executor, token, tmp_path):
    executor.home = str(tmp_path / "home")
    executor.path = "/usr/bin:/bin"
    env = job_env(executor, python_spec(token, "home", DUMP))
    assert env["HOME"] == str(tmp_path / "home")
    assert env["PATH"] == f"{Path(executor.python).parent}:/usr/bin:/bin"
    assert sys.executable  # the runner's interpreter is the job's `python`
