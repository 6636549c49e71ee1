"""A real Slurm for the Slurm executor's tests, brought up by `.ci/slurm.sh up`: the host's node
(4 fake GPUs) in the default partition, and two more nodes (2 fake a100 each, a slurmd of their
own on this host) in the partition `multi` for multi-node jobs.

The session starts slurmctld + the slurmd when they are not running and stops them at the end
only if it started them. Each test gets its own work_dir and a unique name token; every
Slurm job whose name carries the token is cancelled when the test ends.
"""

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from jobs.executors.slurm import SlurmExecutor
from jobs.executors.slurm import executor as slurm_executor
from jobs.executors.slurm.parse import gpu_count, usable_node_state
from jobs.models import Cluster

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / ".ci" / "slurm.sh"
STATE_DIR = Path(os.environ.get("SF_SLURM_DIR", "/tmp/starforge-slurm"))


def slurm(*args: str, conf: str, check: bool = True) -> str:
    """Run a Slurm command against the test cluster (for setup and checks, not the executor)."""
    done = subprocess.run(
        args,
        env={**os.environ, "SLURM_CONF": conf},
        capture_output=True,
        text=True,
        timeout=30,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """Path of the running test cluster's slurm.conf."""
    if shutil.which("sbatch") is None:
        pytest.fail(
            "Slurm is not installed on this machine: run `.ci/slurm.sh install` (as root) "
            "and run the Slurm tests again"
        )
    already_up = subprocess.run([SCRIPT, "status"], capture_output=True).returncode == 0
    if not already_up:
        done = subprocess.run([SCRIPT, "up"], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            pytest.fail(f".ci/slurm.sh up failed:\n{done.stdout}{done.stderr}")
    yield str(STATE_DIR / "etc" / "slurm.conf")
    if not already_up:
        subprocess.run([SCRIPT, "down"], capture_output=True, timeout=60)


@pytest.fixture(autouse=True)
def _fresh_capacity(monkeypatch) -> None:
    """Every capacity() asks Slurm (the executor keeps answers for a second otherwise)."""
    monkeypatch.setattr(slurm_executor, "CAPACITY_TTL_S", 0)
    monkeypatch.setattr(slurm_executor, "_capacities", {})


@pytest.fixture
def token() -> str:
    """A short unique piece of every Slurm job name this test creates."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def cluster_settings(slurm_conf, tmp_path, token):
    settings = {"work_dir": str(tmp_path / "slurm"), "slurm_conf": slurm_conf}
    yield settings
    names = slurm("squeue", "-h", "--all", "-o", "%i %j", conf=slurm_conf)
    ours = [line.split()[0] for line in names.splitlines() if token in line]
    if ours:
        slurm("scancel", *ours, conf=slurm_conf, check=False)


@pytest.fixture
def executor(cluster_settings) -> SlurmExecutor:
    """An executor on the real test cluster; its cluster row is not saved (no database)."""
    return SlurmExecutor(Cluster(name="slurm-test", kind="slurm", settings=cluster_settings))


@pytest.fixture
def idle_gpus(slurm_conf) -> None:
    """Wait until the nodes take jobs and no job holds a GPU on them (jobs of earlier tests may
    still complete; on a loaded host slurmctld may briefly see a node as not responding). The
    multi nodes' GPUs are typed: `gpu:a100:0(IDX:N/A)` is none in use too."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        nodes = slurm("sinfo", "-h", "-N", "-O", "StateLong:|,GresUsed:|", conf=slurm_conf)
        fields = [line.split("|") for line in nodes.splitlines() if line.strip()]
        if fields and all(
            usable_node_state(state) and gpu_count(used) == 0 for state, used, *_ in fields
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"the node stayed unusable or its GPUs busy: {nodes.strip()}")
