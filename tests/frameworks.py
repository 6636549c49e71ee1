"""Real training code in the suite's jobs: where the DDP example lives, the PATH that gives a job
the job environment's `torchrun` (`make jobenv`, the `job_python` fixture), and reading back
what `examples/ddp/train.py` printed (its steps, losses, notices and weight hashes).

Plain functions over log lines as (rank, text) pairs, for the local executor's, the real
stack's and Slurm's tests alike.
"""

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DDP_EXAMPLE = ROOT / "examples" / "ddp"
TRAINING_S = 150  # a bound on any of these jobs: seconds of training, plus torch's start

STEP = re.compile(r"step (\d+) loss (\d+\.\d+)$")
WEIGHTS = re.compile(r"rank (\d+) weights ([0-9a-f]{16})$")
NOTICE = re.compile(r"notice \((\w+|a signal)\): saved step (\d+), exiting$")
RESUMED = re.compile(r"resuming from step (\d+)$")
MARKED = re.compile(r"\[rank (\d+)\] (.*)$")  # a rank's line in console.log, `sf job logs`

Line = tuple[int | None, str]  # (rank, text); rank None where the job has one rank


def uninterrupted_weights(job_python: Path, workdir: Path, last_step: int) -> str:
    """The weights' hash two ranks of the DDP example reach by `last_step` never stopped, run
    by hand on this host (`torchrun --standalone --nproc-per-node 2`, checkpoints and logs in
    folders of `workdir`, which must not hold them yet): the same data, seeds and sums as two
    nodes of one rank each, so a run that was paused, preempted or retried must end on these
    very weights. Each worker's output goes to a file of its own (`--redirects 3`): on one
    shared pipe two workers' lines may interleave."""
    checkpoints, logs = workdir / "reference-checkpoints", workdir / "reference-logs"
    assert not checkpoints.exists(), f"{checkpoints} exists: the reference would resume there"
    argv = [str(job_python.parent / "torchrun"), "--standalone", "--nproc-per-node", "2"]
    argv += ["--redirects", "3", "--log-dir", str(logs)]
    argv += [str(DDP_EXAMPLE / "train.py"), "--steps", str(last_step), "--sleep", "0"]
    env = {"PATH": job_path(job_python), "HOME": str(workdir)}
    env["SF_CHECKPOINT_DIR"] = str(checkpoints)
    done = subprocess.run(
        argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=TRAINING_S
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines: list[Line] = []
    for rank in (0, 1):
        [out] = logs.glob(f"*/attempt_0/{rank}/stdout.log")
        lines += [(rank, text) for text in out.read_text().splitlines()]
    for rank in (0, 1):
        assert not resumed_from(lines, rank), "the reference found a checkpoint: not from 0"
        assert steps(lines, rank) == list(range(1, last_step + 1)), lines[-10:]
    hashes = weights(lines)
    assert sorted(hashes) == [0, 1] and hashes[0] == hashes[1], lines[-10:]
    return hashes[0]


def job_path(job_python: Path) -> str:
    """A job's PATH whose `torchrun` and `python` are the job environment's, as a team's
    `--env PATH=...` names its own venv."""
    return f"{job_python.parent}:/usr/bin:/bin"


def marked(texts: Iterable[str]) -> list[Line]:
    """Lines as console.log and `sf job logs` show a multi-node job's, `[rank N] text`, as
    (rank, text); a line of no rank (the runner's own) is left out."""
    return [(int(m.group(1)), m.group(2)) for text in texts if (m := MARKED.match(text))]


def losses(lines: Iterable[Line], rank: int | None) -> list[tuple[int, float]]:
    """(step, loss) of every step `rank` printed, in order."""
    out = []
    for r, text in lines:
        if r == rank and (m := STEP.match(text)):
            out.append((int(m.group(1)), float(m.group(2))))
    return out


def steps(lines: Iterable[Line], rank: int | None) -> list[int]:
    return [step for step, _ in losses(lines, rank)]


def weights(lines: Iterable[Line]) -> dict[int, str]:
    """{rank: hash of its final weights} from the `rank R weights H` lines."""
    return {int(m.group(1)): m.group(2) for _, text in lines if (m := WEIGHTS.match(text))}


def notices(lines: Iterable[Line]) -> dict[int | None, tuple[str, int]]:
    """{rank: (notice kind, step it saved)} for every rank that printed a notice line."""
    return {r: (m.group(1), int(m.group(2))) for r, text in lines if (m := NOTICE.match(text))}


def resumed_from(lines: Iterable[Line], rank: int | None) -> list[int]:
    """The steps `rank`'s `resuming from step N` lines named, in order (one per resumed
    attempt)."""
    return [int(m.group(1)) for r, text in lines if r == rank and (m := RESUMED.match(text))]


def falls(points: list[tuple[int, float]], window: int = 5) -> bool:
    """Whether the loss fell: the mean of the last `window` steps is under half the first's."""
    if len(points) < 2 * window:
        return False
    first = sum(loss for _, loss in points[:window]) / window
    last = sum(loss for _, loss in points[-window:]) / window
    return last < first / 2
