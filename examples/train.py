"""Toy training loop for Starforge demos: prints a decaying loss, checkpoints, and resumes.

Standard library only, so it runs anywhere the runner does. Checkpoints go to
$SF_CHECKPOINT_DIR (shared by every attempt of a run) or ./checkpoints when run by hand.
Metrics go to the job's Charts and Validation tabs through the `sf` SDK when the client package
is importable; without it the script runs the same, logging nothing. When Starforge preempts
it (or stops it), `sf.should_checkpoint()` turns true: it saves the step it is at and exits, and
the resumed attempt goes on from the next step, so no step runs twice.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

CKPT_RE = re.compile(r"ckpt-(\d+)\.json$")


def loss_at(step: int) -> float:
    """Deterministic loss curve: exponential decay towards 0.05 with a small wiggle."""
    return 0.05 + 2.0 * math.exp(-0.15 * step) + 0.01 * math.sin(step)


def accuracy_at(step: int) -> float:
    """Deterministic validation accuracy: rises from 0.5 towards 0.95."""
    return 0.95 - 0.45 * math.exp(-0.1 * step)


def metrics_sdk():
    """The `sf` module for sf.log / sf.log_validation, or None when it is not installed."""
    try:
        import sf
    except ImportError:
        return None
    return sf


def latest_checkpoint(ckpt_dir: str) -> int:
    """Return the highest checkpointed step, or 0 when there is none."""
    if not os.path.isdir(ckpt_dir):
        return 0
    steps = [int(m.group(1)) for name in os.listdir(ckpt_dir) if (m := CKPT_RE.match(name))]
    return max(steps, default=0)


def save_checkpoint(ckpt_dir: str, step: int, loss: float) -> None:
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, f"ckpt-{step}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"step": step, "loss": loss}, fh)
    os.replace(tmp, path)  # a pause/kill mid-write must not leave a corrupt latest checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.1, help="seconds per step")
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument(
        "--fail-at",
        type=int,
        default=None,
        help="exit 3 at this step on the first attempt only (a transient failure: a retry "
        "resumes from the latest checkpoint and goes on)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ckpt_dir = os.environ.get("SF_CHECKPOINT_DIR") or "checkpoints"
    start = latest_checkpoint(ckpt_dir)
    sf = metrics_sdk()
    if start:
        print(f"resuming from step {start}")
    if sf:
        sf.should_checkpoint()  # early: from here a SIGTERM is a notice, not the end
    for step in range(start + 1, args.steps + 1):
        if step == args.fail_at and os.environ.get("SF_ATTEMPT", "1") == "1":
            print(f"failing at step {step} as asked (--fail-at)", file=sys.stderr)
            return 3
        time.sleep(args.sleep)
        loss = loss_at(step)
        print(f"step {step} loss {loss:.4f}")
        if sf:
            sf.log({"loss": loss}, step=step)
        if args.ckpt_every > 0 and step % args.ckpt_every == 0:
            save_checkpoint(ckpt_dir, step, loss)
            if sf:
                sf.log_validation({"accuracy": accuracy_at(step)}, step=step)
        if sf and sf.should_checkpoint() and step < args.steps:
            save_checkpoint(ckpt_dir, step, loss)
            print(f"notice received: checkpointed step {step}, exiting")
            return 143  # as a process ended by SIGTERM: not done
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
