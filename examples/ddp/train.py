"""A small PyTorch DistributedDataParallel job, written as a team writes one: no Starforge import.

    sf submit --dir examples/ddp --nodes 2 --gpus 0 -- torchrun train.py

torchrun needs no arguments: Starforge starts every rank with the variables torchrun reads
(PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT), and torchrun
gives its worker RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. It trains a tiny regression
model on synthetic data with the gloo backend (CPU; on GPUs use nccl and move the model there).

The contract it follows, which any framework can (see the README's "Your training code"):
- Checkpoints go to $SF_CHECKPOINT_DIR, the same folder for every attempt of a run (resume,
  retry, the attempt after a preemption). Rank 0 saves one every --ckpt-every steps with
  torch.save; at start it loads the newest and sends it to every other rank, so the ranks need
  no shared disk, and the step goes on from there.
- A stop, a pause or a preemption is a SIGTERM, with SIGKILL a grace later ($SF_PREEMPT_GRACE_S
  for a preemption). The handler only notes it; at the end of the step every rank learns that
  some rank was told (an all-reduce), rank 0 saves that step and all exit with 143.
- Each rank prints `step N loss X` and, at the end, `rank R weights <sha256>`: the weights of
  every rank agree when DDP did its job.

Run by hand (`torchrun --nproc-per-node 2 train.py`, or `python train.py`, a world of one), it
checkpoints to ./checkpoints.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16
TRUE_WEIGHTS = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)  # what the model should learn
CHECKPOINT = re.compile(r"step-(\d+)\.pt$")
KEEP_CHECKPOINTS = 3
STOP_EXIT = 143  # as a process ended by SIGTERM: not done, resume me

told_to_stop = False


def on_sigterm(_signum: int, _frame: object) -> None:
    """A stop, a pause or a preemption: finish this step, save it and exit before the SIGKILL."""
    global told_to_stop
    told_to_stop = True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="train up to this step")
    parser.add_argument("--ckpt-every", type=int, default=10, help="save every N steps")
    parser.add_argument("--sleep", type=float, default=0.02, help="extra seconds per step")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--fail-at",
        type=int,
        default=None,
        help="rank 0 exits 3 at this step on the first attempt only (a transient failure: "
        "a retry resumes from the latest checkpoint)",
    )
    return parser.parse_args(argv)


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the same start on every rank (DDP also broadcasts rank 0's)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))


def synthetic_batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's own shard of step `step`: the same on every attempt, so a resumed run sees
    the data it would have seen."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(size, FEATURES, generator=generator)
    noise = 0.01 * torch.randn(size, 1, generator=generator)
    return x, x @ TRUE_WEIGHTS + noise


# -- checkpoints -------------------------------------------------------------------------------
def checkpoint_dir() -> Path:
    return Path(os.environ.get("SF_CHECKPOINT_DIR") or "checkpoints")


def newest_checkpoint(folder: Path) -> Path | None:
    found = [(int(m.group(1)), p) for p in folder.glob("*.pt") if (m := CHECKPOINT.match(p.name))]
    return max(found)[1] if found else None


def save_checkpoint(folder: Path, step: int, model: nn.Module, optimizer) -> None:
    """Rank 0 only. Written aside, then renamed: a SIGKILL mid-write leaves the previous one."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:08d}.pt"
    partial = path.with_suffix(".partial")
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, partial)
    os.replace(partial, path)
    for old in sorted(folder.glob("step-*.pt"))[:-KEEP_CHECKPOINTS]:
        old.unlink()


def resume(model: nn.Module, optimizer, rank: int) -> int:
    """The step the run has reached: rank 0 reads the newest checkpoint and hands it to every
    rank (no shared disk needed); 0 when there is none."""
    state = None
    if rank == 0:
        newest = newest_checkpoint(checkpoint_dir())
        state = torch.load(newest, weights_only=True) if newest else None
    shared = [state]
    if dist.is_initialized():
        dist.broadcast_object_list(shared, src=0)
    state = shared[0]
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


# -- the notice --------------------------------------------------------------------------------
def some_rank_was_told() -> bool:
    """Whether any rank got SIGTERM: every rank must stop at the same step, or the others would
    wait forever in the next all-reduce."""
    flag = torch.tensor([1.0 if told_to_stop else 0.0])
    if dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def notice_kind() -> str:
    """What Starforge said the SIGTERM is ("preempted" or "stopped"), from $SF_NOTICE_FILE: a
    JSON file any language can read. "a signal" when there is none (run by hand)."""
    try:
        with open(os.environ["SF_NOTICE_FILE"]) as fh:
            return str(json.load(fh).get("kind", "a signal"))
    except (KeyError, OSError, ValueError, AttributeError):
        return "a signal"


def weights_hash(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def train(args: argparse.Namespace, rank: int) -> int:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = resume(model, optimizer, rank)
    if start:
        print(f"resuming from step {start}", flush=True)
    ddp = DistributedDataParallel(model) if dist.is_initialized() else model
    loss_fn = nn.MSELoss()
    for step in range(start + 1, args.steps + 1):
        if rank == 0 and step == args.fail_at and os.environ.get("SF_ATTEMPT", "1") == "1":
            print(f"failing at step {step} as asked (--fail-at)", flush=True)
            return 3
        x, y = synthetic_batch(step, rank, args.batch)
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()  # DDP averages the gradients of every rank here
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        time.sleep(args.sleep)
        if some_rank_was_told():
            if rank == 0:
                save_checkpoint(checkpoint_dir(), step, model, optimizer)
            print(f"notice ({notice_kind()}): saved step {step}, exiting", flush=True)
            return STOP_EXIT
        if rank == 0 and args.ckpt_every > 0 and step % args.ckpt_every == 0:
            save_checkpoint(checkpoint_dir(), step, model, optimizer)
    print(f"rank {rank} weights {weights_hash(model)}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    distributed = "WORLD_SIZE" in os.environ and "RANK" in os.environ  # started by torchrun
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    try:
        return train(args, rank)
    finally:
        if distributed:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
