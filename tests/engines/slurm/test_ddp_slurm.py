"""examples/ddp for real on the real two-node Slurm (the `multi` partition of `.ci/slurm.sh`: two
slurmd on this host, multi1 at 127.0.0.2 and multi2 at 127.0.0.3): `torchrun train.py` with no
torchrun argument, one rank per node, in the job environment's Python (`make jobenv`). Both
ranks rendezvous at rank 0's node address through the PET_* variables, train with DDP over
gloo, end with the same weights and a falling loss, and the runner reports both succeeded.
A preemption's SIGTERM (scancel --signal=TERM to every step) makes every rank stop at the same
step, rank 0 save it, and all exit within the grace; the next attempt resumes from that step.
"""

import json
import time
from pathlib import Path

import pytest
from sf.contract import CONSOLE_LOG, RECORD_KEY_VAR, STOP_GRACE_VAR

from jobs.executors import LaunchSpec
from jobs.executors.base import record_key
from jobs.executors.slurm import SlurmExecutor
from jobs.executors.slurm.parse import gpu_count, usable_node_state
from jobs.models import Cluster
from tests import frameworks
from tests.access import let_jobs_through
from tests.engines.slurm.conftest import slurm
from tests.engines.slurm.helpers import FINAL, attempt_dir, wait_for

pytestmark = pytest.mark.slurm
MULTI = ("multi1", "multi2")
STEPS = 30
GRACE_S = 30


@pytest.fixture
def multi(cluster_settings) -> SlurmExecutor:
    """An executor on the `multi` partition of the test cluster (row not saved)."""
    settings = {**cluster_settings, "partition": "multi"}
    return SlurmExecutor(Cluster(name="slurm-multi", kind="slurm", settings=settings))


@pytest.fixture
def multi_idle(slurm_conf) -> None:
    """Wait until both multi nodes take jobs and no job holds a GPU there."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = slurm("sinfo", "-h", "-N", "-p", "multi", "-O", "NodeList:|,StateLong:|,GresUsed:|",
                    conf=slurm_conf)  # fmt: skip
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        if sorted(r[0] for r in rows) == list(MULTI) and all(
            usable_node_state(r[1]) and gpu_count(r[2]) == 0 for r in rows
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"the multi nodes stayed unusable or their GPUs busy: {out.strip()}")


def torchrun_spec(
    token: str, job_python: Path, checkpoints: Path, *args: str, attempt: int = 1
) -> LaunchSpec:
    """`torchrun train.py ARGS` on two nodes with no GPUs (offline runner: no API, no snapshot,
    so the script is named by its path), signed as the launcher's key would sign it; a
    preemption's SIGTERM gives the runner's job GRACE_S before SIGKILL, as the launcher says."""
    run_id = f"{token}ddp"
    name = f"sf-{run_id}-a{attempt}"
    argv = [str(job_python.parent / "torchrun"), str(frameworks.DDP_EXAMPLE / "train.py"), *args]
    env = {
        "SF_API_URL": "",
        "SF_SNAPSHOT": "",
        "SF_ENTRYPOINT": json.dumps(argv),
        "SF_CHECKPOINT_DIR": str(checkpoints),
        "SF_ATTEMPT": str(attempt),
        STOP_GRACE_VAR: str(GRACE_S),
        RECORD_KEY_VAR: record_key(name),
    }
    return LaunchSpec(
        name=name,
        job_id=1,
        run_id=run_id,
        attempt=attempt,
        total_gpus=0,
        entrypoint=argv,
        env=env,
        nodes=2,
    )


def test_torchrun_with_no_arguments_trains_one_rank_per_node_to_the_same_weights(
    multi, token, multi_idle, job_python, tmp_path
):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    let_jobs_through(checkpoints)
    spec = torchrun_spec(token, job_python, checkpoints, "--steps", str(STEPS), "--sleep", "0")
    ref = multi.submit(spec)
    final = wait_for(multi, ref, FINAL, timeout=frameworks.TRAINING_S)[-1]
    lines = frameworks.marked((attempt_dir(multi, spec) / CONSOLE_LOG).read_text().splitlines())
    assert (final.native_state, final.exit_code) == ("COMPLETED", 0), lines[-20:]
    ranks = final.details["ranks"]
    assert [(r["rank"], r["state"], r["exit_code"]) for r in ranks] == [
        (0, "succeeded", 0),
        (1, "succeeded", 0),
    ]
    assert sorted(r["node"] for r in ranks) == list(MULTI)  # one rank on each node
    hashes = frameworks.weights(lines)
    assert sorted(hashes) == [0, 1] and hashes[0] == hashes[1], hashes
    for rank in (0, 1):
        points = frameworks.losses(lines, rank)
        assert [step for step, _ in points] == list(range(1, STEPS + 1)), rank
        assert frameworks.falls(points), points
    # Rank 0 saved with torch.save every 10 steps, the last three kept.
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        f"step-{step:08d}.pt" for step in (10, 20, 30)
    ]


def test_a_preemption_signal_makes_every_rank_save_and_exit_and_the_next_attempt_resumes(
    multi, token, multi_idle, job_python, tmp_path
):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    let_jobs_through(checkpoints)
    slow = ("--steps", "500", "--sleep", "0.1", "--ckpt-every", "1000")  # no periodic save
    first = torchrun_spec(token, job_python, checkpoints, *slow)
    ref = multi.submit(first)
    log = attempt_dir(multi, first) / CONSOLE_LOG

    def lines() -> list[frameworks.Line]:
        return frameworks.marked(log.read_text().splitlines()) if log.exists() else []

    deadline = time.monotonic() + frameworks.TRAINING_S
    while max(frameworks.steps(lines(), 0), default=0) < 5:
        assert time.monotonic() < deadline, f"rank 0 never reached step 5: {lines()[-20:]}"
        time.sleep(0.2)
    noticed = time.monotonic()
    multi.preempt(ref, GRACE_S)  # scancel --signal=TERM --full: every step, the runner's too
    final = wait_for(multi, ref, FINAL, timeout=GRACE_S + 30)[-1]
    took = time.monotonic() - noticed
    said = frameworks.notices(lines())
    assert sorted(said) == [0, 1] and said[0] == said[1], (said, lines()[-20:])
    saved = said[0][1]
    print(f"every rank saved and exited {took:.1f} s after the preemption's SIGTERM")
    assert took < GRACE_S, f"the ranks took {took:.1f} s to save and exit"
    assert final.native_state != "COMPLETED", final  # it did not run to its end
    assert [p.name for p in checkpoints.iterdir()] == [f"step-{saved:08d}.pt"]

    assert saved < STEPS
    second = torchrun_spec(
        token, job_python, checkpoints, "--steps", str(STEPS), "--sleep", "0", attempt=2
    )
    ref = multi.submit(second)
    final = wait_for(multi, ref, FINAL, timeout=frameworks.TRAINING_S)[-1]
    resumed = frameworks.marked((attempt_dir(multi, second) / CONSOLE_LOG).read_text().splitlines())
    assert (final.native_state, final.exit_code) == ("COMPLETED", 0), resumed[-20:]
    for rank in (0, 1):
        assert frameworks.resumed_from(resumed, rank) == [saved]
        assert frameworks.steps(resumed, rank) == list(range(saved + 1, STEPS + 1))
    # The weights of a run nothing stopped: the model, the optimizer and the step went on.
    reference = frameworks.uninterrupted_weights(job_python, tmp_path, STEPS)
    assert frameworks.weights(resumed) == {0: reference, 1: reference}
