"""The Slurm executor and the nodes an attempt ran on: every poll of a job that holds nodes
names them (single-node jobs too), and an attempt whose job hung before is submitted with
`--exclude` of the nodes its hung attempts ran on, as many as leave the job enough nodes
(`nodes_to_avoid`). Slurm's answers come from a stand-in command runner here; the real
two-node Slurm proof is tests/engines/slurm/test_hung_node_avoided.py."""

import pytest

from jobs.executors import Capacity, LaunchSpec, NodeCapacity
from jobs.executors.base import nodes_to_avoid
from jobs.executors.slurm import SlurmExecutor
from jobs.executors.slurm import executor as slurm_executor
from jobs.models import Cluster
from tests.engines.slurm.helpers import FakeSlurm

START, END = 1_795_000_000, 1_795_000_042
# sinfo -N of the `multi` partition: two usable nodes of two a100 each, and a drained one.
MULTI = (
    "multi1|multi|idle|gpu:a100:2(S:0)|gpu:a100:0(IDX:N/A)|\n"
    "multi2|multi|idle|gpu:a100:2(S:0)|gpu:a100:0(IDX:N/A)|\n"
    "multi3|multi|drained|gpu:a100:2(S:0)|gpu:a100:0(IDX:N/A)|\n"
)


@pytest.fixture
def fake(monkeypatch) -> FakeSlurm:
    monkeypatch.setattr(slurm_executor, "_capacities", {})  # no answer kept from another test
    fake = FakeSlurm()
    fake.answer("sinfo", MULTI)
    fake.answer("sbatch", "4242\n")
    return fake


@pytest.fixture
def executor(fake, tmp_path) -> SlurmExecutor:
    settings = {"work_dir": str(tmp_path), "partition": "multi"}
    return SlurmExecutor(Cluster(name="hpc", kind="slurm", settings=settings), run=fake)


def spec(attempt: int = 2, nodes: int = 1, avoid: tuple[str, ...] = ()) -> LaunchSpec:
    return LaunchSpec(
        name=f"sf-run1-a{attempt}",
        job_id=1,
        run_id="run1",
        attempt=attempt,
        total_gpus=nodes,
        entrypoint=["python", "train.py"],
        env={},
        nodes=nodes,
        avoid_nodes=avoid,
    )


def sbatch(fake: FakeSlurm) -> list[str]:
    (call,) = [c for c in fake.calls if c[0] == "sbatch"]
    return call


def test_a_retry_after_a_hang_is_submitted_kept_off_the_node_that_hung(executor, fake):
    assert executor.submit(spec(avoid=("multi1",))) == "4242"
    assert "--exclude=multi1" in sbatch(fake)


def test_an_attempt_whose_job_never_hung_is_submitted_without_exclude(executor, fake):
    executor.submit(spec(attempt=1))
    assert not [arg for arg in sbatch(fake) if arg.startswith("--exclude")]
    assert [c[0] for c in fake.calls] == ["sbatch"]  # nothing to avoid: no capacity asked


def test_the_nodes_of_several_hangs_are_all_kept_off_while_enough_are_left(executor, fake):
    fake.answer("sinfo", MULTI + "multi4|multi|idle|gpu:a100:2(S:0)|gpu:a100:0(IDX:N/A)|\n")
    executor.submit(spec(avoid=("multi1", "multi2")))
    assert "--exclude=multi2,multi1" in sbatch(fake)


def test_a_node_whose_exclusion_would_leave_too_few_is_not_excluded(executor, fake):
    """Two usable nodes for a two-node job: keeping it off either would make it unrunnable."""
    executor.submit(spec(nodes=2, avoid=("multi1",)))
    assert not [arg for arg in sbatch(fake) if arg.startswith("--exclude")]


def test_nodes_slurm_does_not_offer_are_never_named_to_sbatch(executor, fake):
    """A drained node and one Slurm no longer has: sbatch would refuse an unknown name."""
    executor.submit(spec(avoid=("gone7", "multi3")))
    assert not [arg for arg in sbatch(fake) if arg.startswith("--exclude")]


def caps(*names: str, gpu_type: str = "a100") -> Capacity:
    return Capacity(True, 2 * len(names), nodes=tuple(NodeCapacity(n, 2, gpu_type) for n in names))


def test_the_most_recent_hang_is_kept_off_first_and_the_oldest_tried_again_first():
    three = caps("a", "b", "c")
    assert nodes_to_avoid(["a", "b"], three, ranks=1, gpu_type="") == ["b", "a"]
    assert nodes_to_avoid(["a", "b"], three, ranks=2, gpu_type="") == ["b"]
    assert nodes_to_avoid(["a", "b"], three, ranks=3, gpu_type="") == []
    assert nodes_to_avoid(["a"], caps("a"), ranks=1, gpu_type="") == []  # its only node
    assert nodes_to_avoid(["a"], Capacity(True, 8), ranks=1, gpu_type="") == []  # a pool


def test_only_nodes_of_the_jobs_gpu_type_count_as_left_for_it():
    mixed = Capacity(
        True,
        6,
        nodes=(NodeCapacity("a", 2, "a100"), NodeCapacity("b", 2, "h100"), NodeCapacity("c", 2)),
    )
    assert nodes_to_avoid(["a"], mixed, ranks=1, gpu_type="a100") == []  # no other a100 node
    assert nodes_to_avoid(["a"], mixed, ranks=1, gpu_type="") == ["a"]


def squeue_line(job_id: str, state: str, nodes: str, name: str = "sf-run1-a1") -> str:
    end = "N/A" if state == "RUNNING" else END
    return f"{job_id}|{state}|None|{START}|{end}|0|{nodes}|{name}|\n"


def test_a_poll_names_the_nodes_a_job_holds_in_the_order_its_ranks_take_them(executor, fake):
    fake.answer(
        "squeue",
        squeue_line("1", "RUNNING", "multi1")
        + squeue_line("2", "RUNNING", "multi[1-2]")
        + squeue_line("3", "PENDING", ""),
    )
    found = executor.poll(["1", "2", "3"])
    assert found["1"].details["nodes"] == ["multi1"]  # a single-node job too
    assert found["2"].details["nodes"] == ["multi1", "multi2"]
    assert "nodes" not in found["3"].details


def test_a_job_squeue_forgot_names_its_nodes_from_accounting(executor, fake):
    fake.answer("squeue", rc=1, stderr="slurm_load_jobs error: Invalid job id specified\n")
    fake.answer(
        "sacct",
        f"5|COMPLETED|None|{START}|{END}|0:0|multi2|sf-run1-a1\n"
        f"6|CANCELLED by 0|None|Unknown|{END}|0:0|None assigned|sf-run2-a1\n",
    )
    found = executor.poll(["5", "6"])
    assert found["5"].details["nodes"] == ["multi2"]
    assert "nodes" not in found["6"].details  # cancelled while it waited: it held none
