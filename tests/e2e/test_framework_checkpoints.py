"""Real PyTorch training keeps its place across attempts, on the real stack (ASGI server, Celery
worker and beat, the local executor as root: each rank sandboxed under its team's uid): the DDP
example (`examples/ddp/train.py`, torchrun with no arguments, two ranks, the job environment of
`make jobenv`) saves `torch.save` checkpoints to $SF_CHECKPOINT_DIR and is driven through `sf`
as a user would:

- a pause is a SIGTERM: every rank stops at the same step, rank 0 saves it, and after
  `sf job resume` the next attempt goes on from that step;
- a failure (`--fail-at`) then `sf job retry`: the retry goes on from the last periodic
  checkpoint, not from step 0;
- a preemption (team lab takes back the GPUs demo borrowed): the notice reaches the training
  loop, which saves and exits within the grace, and the attempt queued after it resumes there.

In every case each rank runs every step once across attempts (or, after a failure, again from
the checkpoint on) and both ranks end with the same weights.
"""

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import frameworks
from tests.e2e.stack import sf_command, wait_until
from tests.engines.proof import LENDER, LENDER_GONE, EngineProof, on_local_stack

pytestmark = pytest.mark.e2e
GRACE_S = 30  # a preemption's; a pause's is the runner's own 10 s
STEPS = 40


@pytest.fixture(scope="module")
def proof(tmp_path_factory, job_python) -> Iterator[EngineProof]:
    env = {"SF_PREEMPT_MIN_RUNTIME_S": "3", "SF_PREEMPT_GRACE_S": str(GRACE_S)}
    with on_local_stack(tmp_path_factory, **env) as running:
        yield running


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, job_python) -> str:
    """The hash of the weights the same training reaches when nothing stops it."""
    return frameworks.uninterrupted_weights(job_python, tmp_path_factory.mktemp("ddp"), STEPS)


@pytest.fixture(autouse=True)
def _stack_logs_on_failure(request, proof) -> Iterator[None]:
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line(f"\nstack logs after {request.node.name}:\n{proof.stack.diagnostics()}")


def torchrun(job_python: Path, *args: str, gpus: int = 0) -> list[str]:
    """`sf submit` arguments for the DDP example on two nodes in the job environment."""
    return [
        "--dir", "ddp", "--nodes", "2", "--gpus", str(gpus),
        "--env", f"PATH={frameworks.job_path(job_python)}",
        "--", "torchrun", "train.py", "--steps", str(STEPS), *args,
    ]  # fmt: skip


def rank_lines(proof: EngineProof, job_id: int) -> list[frameworks.Line]:
    return frameworks.marked(proof.logs(job_id))


def wait_for_step(proof: EngineProof, job_id: int, step: int) -> None:
    wait_until(
        lambda: max(frameworks.steps(rank_lines(proof, job_id), 0), default=0) >= step,
        frameworks.TRAINING_S,
        f"rank 0 at step {step}",
        proof.stack.diagnostics,
    )


def saved_at_the_notice(proof: EngineProof, job_id: int, kind: str) -> int:
    """The step both ranks stopped at, once each has said it saved and exited."""
    wait_until(
        lambda: len(frameworks.notices(rank_lines(proof, job_id))) == 2,
        60,
        "both ranks' notice lines",
        proof.stack.diagnostics,
    )
    said = frameworks.notices(rank_lines(proof, job_id))
    assert said[0] == said[1] and said[0][0] == kind, said
    return said[0][1]


def trained_to_the_end(
    lines: list[frameworks.Line], *expected: range, resumed: int, uninterrupted: str
) -> None:
    """Each rank printed exactly the steps `expected` (one range per attempt), the second
    attempt having loaded the checkpoint of step `resumed`, and both ended on the weights of
    a run nothing stopped: the model, the optimizer's state and the step all went on."""
    steps = [step for attempt in expected for step in attempt]
    for rank in (0, 1):
        assert frameworks.resumed_from(lines, rank) == [resumed], (rank, lines[-30:])
        assert frameworks.steps(lines, rank) == steps, (rank, lines[-30:])
    assert frameworks.weights(lines) == {0: uninterrupted, 1: uninterrupted}


def test_pause_saves_the_step_every_rank_is_at_and_resume_goes_on_from_it(
    proof, job_python, uninterrupted
):
    job = proof.submit(*torchrun(job_python, "--sleep", "0.2", "--ckpt-every", "100"))
    job_id = job["id"]
    wait_for_step(proof, job_id, 8)
    assert proof.verb("pause", job_id)["status"] == "PAUSED"
    saved = saved_at_the_notice(proof, job_id, "stopped")
    assert 8 <= saved < STEPS

    proof.sf("job", "resume", str(job_id))
    done = proof.wait_status(job_id, "SUCCEEDED", timeout=frameworks.TRAINING_S)
    lines = rank_lines(proof, job_id)
    trained_to_the_end(
        lines,
        range(1, saved + 1),
        range(saved + 1, STEPS + 1),
        resumed=saved,
        uninterrupted=uninterrupted,
    )
    first, second = proof.stack.attempts(job_id)
    assert first["end_reason"].startswith("paused by") and second["exit_code"] == 0
    assert (done["run_id"], done["attempt"], done["retry_count"]) == (job["run_id"], 2, 0)


def test_retry_after_a_failure_goes_on_from_the_last_checkpoint_not_from_step_0(
    proof, job_python, uninterrupted
):
    job = proof.submit(
        "--max-retries", "0", *torchrun(job_python, "--ckpt-every", "5", "--fail-at", "17")
    )
    job_id = job["id"]
    proof.wait_status(job_id, "FAILED", timeout=frameworks.TRAINING_S)

    proof.sf("job", "retry", str(job_id))
    done = proof.wait_status(job_id, "SUCCEEDED", timeout=frameworks.TRAINING_S)
    lines = rank_lines(proof, job_id)
    # From the periodic checkpoint of step 15, not from 0: steps 16 and on run again.
    trained_to_the_end(
        lines, range(1, 17), range(16, STEPS + 1), resumed=15, uninterrupted=uninterrupted
    )
    assert (done["run_id"], done["attempt"], done["retry_count"]) == (job["run_id"], 2, 1)


def test_a_preemption_notice_makes_the_training_loop_save_and_exit_within_the_grace(
    proof, job_python, uninterrupted
):
    lea_token = proof.stack._manage("shell", "-c", LENDER.format(cluster=proof.cluster))
    lea_token = lea_token.stdout.strip().splitlines()[-1]
    try:
        preempted_and_resumed(proof, job_python, lea_token, uninterrupted)
    finally:
        proof.stack._manage("shell", "-c", LENDER_GONE)


def preempted_and_resumed(
    proof: EngineProof, job_python: Path, lea_token: str, uninterrupted: str
) -> None:
    # Team demo has no quota of its own: its two ranks run on the 2 GPUs it borrowed from lab.
    args = torchrun(job_python, "--sleep", "0.2", "--ckpt-every", "100", gpus=1)
    job = proof.submit(*args)
    job_id = job["id"]
    wait_for_step(proof, job_id, 8)  # past the 3 s minimum runtime
    lab = sf_command(proof.workdir, proof.home / "lea.json")
    lab("login", "--url", proof.stack.url, "--token", lea_token)
    mine = lab("submit", "--json", "--cluster", proof.cluster, "--gpus", "2", "--",
               "python", "train.py", "--steps", "4", "--sleep", "0.1")  # fmt: skip
    proof.submitted.append(json.loads(mine.stdout)["id"])
    saved = saved_at_the_notice(proof, job_id, "preempted")
    proof.wait(job_id, lambda j: j["status"] == "PAUSED" or j["attempt"] > 1, "preempted")

    first = proof.stack.attempts(job_id)[0]
    assert first["end_reason"] == "preempted: borrowed GPUs returned to the lending team"
    noticed = next(e for e in proof.events(job_id) if e["reason"].startswith("preemption notice"))
    took = (_ts(first["end_time"]) - _ts(noticed["time"])).total_seconds()
    print(f"the training loop saved and every rank exited {took:.1f} s after the notice")
    assert took < GRACE_S, f"the job ended {took:.1f} s after its notice"

    done = proof.wait_status(job_id, "SUCCEEDED", timeout=frameworks.TRAINING_S)
    lines = rank_lines(proof, job_id)
    trained_to_the_end(
        lines,
        range(1, saved + 1),
        range(saved + 1, STEPS + 1),
        resumed=saved,
        uninterrupted=uninterrupted,
    )
    assert done["retry_count"] == 0 and done["run_id"] == job["run_id"]


def _ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)
