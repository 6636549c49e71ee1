"""Owns how the runner starts the ranks of a multi-node job, per `sf.contract.RANK_LAUNCH_VAR`.

One runner supervises every rank of its attempt: it starts them together, numbers their log
lines into one stream (each line marked with its rank), ends all of them as soon as one fails
(fail fast) and writes one exit record. Where the ranks run is the launch mode's:

- "local": process groups on the runner's host, each with its own GPU slots (SF_RANK_GPUS),
  rank 0 at 127.0.0.1 on a port free here;
- "srun": one `srun` step per rank inside the Slurm allocation the runner's batch step is in,
  rank r on the allocation's r-th node (the batch step runs on node 0, so rank 0's port is
  picked here); Slurm sets each step's CUDA_VISIBLE_DEVICES from its GRES.

Standard library only, like the runner.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from sf.contract import (
    GPUS_PER_NODE_VAR,
    NUM_NODES_VAR,
    RANK_GPUS_VAR,
    RANK_LAUNCH_VAR,
    RANK_LAUNCHES,
    rank_env,
)

SCONTROL_TIMEOUT_S = 30


class RankPlanError(Exception):
    """The ranks cannot be planned (a bad contract value, Slurm not answering): the job's
    code never runs, and the attempt fails as an ingest failure with this sentence."""


@dataclass(frozen=True)
class RankPlan:
    index: int
    node: str  # the node the rank runs on, as the engine names it
    argv: list[str]
    env: dict[str, str]


def plan_ranks(
    environ: dict[str, str], argv: list[str], child: dict[str, str], run_dir: str
) -> list[RankPlan]:
    """The ranks to start: one plan per rank; a single plan (the job itself, as it always
    ran) when the executor asked for no rank launch."""
    mode = environ.get(RANK_LAUNCH_VAR, "")
    if not mode:
        return [RankPlan(0, socket.gethostname(), argv, child)]
    if mode not in RANK_LAUNCHES:
        raise RankPlanError(f"{RANK_LAUNCH_VAR}={mode!r} is not one of {', '.join(RANK_LAUNCHES)}")
    nodes = _count(environ, NUM_NODES_VAR, minimum=1)
    gpus = _count(environ, GPUS_PER_NODE_VAR, minimum=0)
    if mode == "local":
        return _local(environ, argv, child, nodes, gpus)
    return _srun(environ, argv, child, nodes, gpus, run_dir)


def _local(environ: dict, argv: list[str], child: dict, nodes: int, gpus: int) -> list[RankPlan]:
    slots = _rank_gpus(environ, nodes)
    addrs = ["127.0.0.1"] * nodes
    port = free_port("127.0.0.1")
    host = socket.gethostname()
    plans = []
    for rank in range(nodes):
        env = {**child, **rank_env(rank, nodes, gpus, addrs, port)}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if slots is not None:
            env["CUDA_VISIBLE_DEVICES"] = slots[rank]
        plans.append(RankPlan(rank, host, argv, env))
    return plans


def _srun(
    environ: dict, argv: list[str], child: dict, nodes: int, gpus: int, run_dir: str
) -> list[RankPlan]:
    nodelist = environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        raise RankPlanError("SF_RANK_LAUNCH=srun but the runner is not inside a Slurm allocation")
    hosts = _scontrol(["show", "hostnames", nodelist], environ).split()
    if len(hosts) != nodes:
        raise RankPlanError(
            f"the Slurm allocation has {len(hosts)} nodes ({nodelist}); the job asked for {nodes}"
        )
    addrs = node_addrs(hosts, environ)
    port = free_port("")
    # What srun itself needs to find the allocation; the job's own environment is `child`.
    slurm = {k: v for k, v in environ.items() if k.startswith("SLURM_")}
    plans = []
    for rank, host in enumerate(hosts):
        env = {**slurm, **child, **rank_env(rank, nodes, gpus, addrs, port)}
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm sets it for the step from its GRES
        step = [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            f"--relative={rank}",
            "--kill-on-bad-exit=1",
            "--export=ALL",
            f"--chdir={run_dir}",
            f"--gres=gpu:{gpus}" if gpus else "--gres=none",
            f"--job-name=rank{rank}",
            # srun's progress lines ("forcing job termination", "Job step aborted") stay out
            # of the job's log; its errors, such as a rank's exit code, stay in
            "--quiet",
            "--",
            *argv,
        ]
        plans.append(RankPlan(rank, host, step, env))
    return plans


def terminator(environ: dict[str, str], plans: list[RankPlan]) -> Callable[[], None] | None:
    """How to SIGTERM every rank with its grace, where signalling their processes here would
    not: srun turns a SIGTERM into an immediate kill of its remote task, so the ranks' steps are
    signalled through Slurm (`scancel --signal=TERM`, which leaves the batch step, this runner,
    alone). None: signalling the ranks' process groups is the way (local ranks)."""
    job = environ.get("SLURM_JOB_ID", "")
    if not job or not any(p.argv[:1] == ["srun"] for p in plans):
        return None

    def terminate() -> None:
        try:
            subprocess.run(
                ["scancel", "--signal=TERM", job],
                env=environ,
                capture_output=True,
                timeout=SCONTROL_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            pass  # the SIGKILL after the grace still ends every rank

    return terminate


def node_addrs(hosts: list[str], environ: dict[str, str]) -> list[str]:
    """Each node's address as Slurm knows it (NodeAddr), falling back to its name."""
    out = _scontrol(["show", "node", "-o", ",".join(hosts)], environ)
    addr = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            addr[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return [addr.get(h, h) for h in hosts]


def free_port(host: str) -> int:
    """A TCP port free on this host now, for rank 0's rendezvous (MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _scontrol(args: list[str], environ: dict[str, str]) -> str:
    try:
        done = subprocess.run(
            ["scontrol", *args],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            env=environ,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RankPlanError(f"scontrol {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise RankPlanError(f"scontrol {' '.join(args)}: {done.stderr.strip()[:300]}")
    return done.stdout


def _count(environ: dict[str, str], name: str, minimum: int) -> int:
    raw = environ.get(name, "")
    if not raw.isdigit() or int(raw) < minimum:
        raise RankPlanError(f"{name} must be a whole number of at least {minimum}, not {raw!r}")
    return int(raw)


def _rank_gpus(environ: dict[str, str], nodes: int) -> list[str] | None:
    raw = environ.get(RANK_GPUS_VAR)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not (
        isinstance(value, list) and len(value) == nodes and all(isinstance(v, str) for v in value)
    ):
        raise RankPlanError(f"{RANK_GPUS_VAR} must be a JSON list of {nodes} strings")
    return value


def rank_states(codes: list[int | None], failed: int | None, stopped: bool) -> list[str]:
    """Each rank's state from its exit code: the rank that failed first is "failed", ranks
    ended because of it (or by a stop) "killed", the rest by their own codes."""
    states = []
    for index, code in enumerate(codes):
        if code is None:
            states.append("running")
        elif index == failed and not stopped:
            states.append("failed")
        elif code == 0:
            states.append("succeeded")
        elif failed is not None or stopped:
            states.append("killed")
        else:
            states.append("failed")
    return states


__all__ = [
    "RankPlan",
    "RankPlanError",
    "free_port",
    "node_addrs",
    "plan_ranks",
    "rank_states",
    "terminator",
]
