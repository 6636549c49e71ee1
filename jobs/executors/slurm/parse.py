"""What the Slurm commands answer, read: squeue's and sacct's job rows (`JobRow`), sinfo's node
states and GRES, a batch step's wait status, and Slurm's compact host lists. Pure: the executor
runs the commands, this module reads their output."""

import datetime as dt
import re
from dataclasses import dataclass

from sf.contract import entrypoint_code

# squeue -O with a "|" suffix per field: no padding, no truncation; the name goes last.
POLL_FIELDS = "JobID:|,State:|,Reason:|,StartTime:|,EndTime:|,exit_code:|,NodeList:|,Name:|"
# What sacct and squeue write in NodeList for a job that holds no node (yet).
NO_NODES = frozenset({"", "None assigned", "(null)", "N/A"})
# Node states (sinfo %T) in which a node takes new jobs; down, drained, draining, reserved and
# the like do not count. A flag after the state counts only when it is "-" (planned by backfill
# for a waiting job, still schedulable); `idle*` (not responding), `idle~` (powered down) and the
# other flags take the node out.
USABLE_NODE_STATES = frozenset({"idle", "mixed", "allocated", "completing", "planned"})
USABLE_NODE_FLAGS = frozenset("-")
NODE_FLAGS = "*~#%!$@^-"
# One GPU GRES of a Gres/GresUsed/TRES string: (its type, "" or "(null)" when untyped; count).
GPU_GRES = re.compile(r"\bgpu(?::(\(null\)|[^:,()]+))?:(\d+)")


@dataclass(frozen=True)
class NodeRow:
    """One usable node of the partition as sinfo reports it."""

    gpus: int  # configured GRES
    used: int  # allocated now, by any job
    gpu_type: str  # "" when untyped


@dataclass(frozen=True)
class JobRow:
    """One Slurm job as squeue or sacct reports it."""

    job_id: str
    state: str
    reason: str
    start: dt.datetime | None
    end: dt.datetime | None
    exit_status: int | None  # the raw wait status: exit 3 is 768, SIGKILL is 9
    name: str
    nodes: tuple[str, ...] = ()  # the allocation's nodes (NodeList), in the order ranks take them


def parse_squeue(out: str, now: dt.datetime) -> list[JobRow]:
    """squeue -O POLL_FIELDS lines; `now` is when squeue answered (see `_epoch`)."""
    rows = []
    for line in out.splitlines():
        fields = line.split("|", 7)
        if len(fields) < 8:
            continue
        job_id, state, reason, start, end, status, nodes, name = fields
        rows.append(
            JobRow(
                job_id.strip(),
                state.strip(),
                reason.strip(),
                _epoch(start, now),
                _epoch(end, now),
                _int(status),
                name.removesuffix("|"),
                _nodes(nodes),
            )
        )
    return rows


def parse_sacct(out: str, now: dt.datetime) -> list[JobRow]:
    """sacct -P lines: JobID|State|Reason|Start|End|ExitCode (code:signal)|NodeList|JobName."""
    rows = []
    for line in out.splitlines():
        fields = line.split("|", 7)
        if len(fields) < 8 or not fields[0].isdigit():
            continue
        job_id, state, reason, start, end, exit_code, nodes, name = fields
        code, _, signal = exit_code.partition(":")
        status = (_int(code) or 0) << 8 | (_int(signal) or 0)
        state = state.split()[0] if state.strip() else ""  # "CANCELLED by 1000"
        rows.append(
            JobRow(
                job_id,
                state,
                reason,
                _epoch(start, now),
                _epoch(end, now),
                status,
                name,
                _nodes(nodes),
            )
        )
    return rows


def exit_code_of(status: int) -> int:
    """The exit code of a wait status; -N for a signal N that killed the batch step, or the
    entrypoint (the runner then exits 128+N), as the local executor reports it."""
    code, signal = status >> 8, status & 0x7F
    if signal:
        return -signal
    return entrypoint_code(code)


def usable_node_state(state: str) -> bool:
    """Whether a node in this sinfo state (`idle`, `mixed-`, `idle*`, `drained`...) takes jobs."""
    base = state.rstrip(NODE_FLAGS)
    return base in USABLE_NODE_STATES and set(state[len(base) :]) <= USABLE_NODE_FLAGS


def gpu_count(gres: str) -> int:
    """GPUs in a GRES string: gpu:4, gpu:a100:2(S:0-1), gres:gpu:2, gres/gpu:2, gpu:0(IDX:N/A)."""
    return sum(int(n) for _, n in GPU_GRES.findall(gres))


def gpu_gres_type(gres: str) -> str:
    """The GPU type of a node's GRES (`gpu:a100:2(S:0)`: "a100"; untyped `gpu:4`: "").

    A node with GPUs of several types (rare: sites group one kind per node) is reported as
    the type it has most of (ties: the first in name order), with all its GPUs counted, so a
    job asking for any type gets the whole node, as Slurm would give it. The cost is on typed
    jobs there: one asking for the node's other type is not placed on it, and one asking for
    more of its main type than it has may be admitted and then wait in Slurm's queue.
    """
    counts: dict[str, int] = {}
    for kind, n in GPU_GRES.findall(gres):
        kind = "" if kind == "(null)" else kind
        counts[kind] = counts.get(kind, 0) + int(n)
    typed = sorted((-n, kind) for kind, n in counts.items() if kind and n)
    return typed[0][1] if typed else ""


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compact node list (`multi[1-2],gpu[01-03,07],login`) as node names, as
    `scontrol show hostnames` gives them, without a command per job."""
    names: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", hostlist.strip()):
        names += _expand_host(item)
    return names


def _expand_host(item: str) -> list[str]:
    bracket = re.search(r"\[([^\]]*)\]", item)
    if bracket is None:
        return [item]
    head, tails = item[: bracket.start()], _expand_host(item[bracket.end() :])
    names = []
    for part in bracket.group(1).split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or not (high or low).isdigit():
            return [item]  # not a range Slurm writes: the name as it stands
        for number in range(int(low), int(high or low) + 1):
            names += [f"{head}{number:0{len(low)}d}{tail}" for tail in tails]
    return names


def _nodes(nodelist: str) -> tuple[str, ...]:
    """The node names of a job's NodeList; none for a job that holds none."""
    nodelist = nodelist.strip()
    return () if nodelist in NO_NODES else tuple(expand_hostlist(nodelist))


def _epoch(value: str, now: dt.datetime) -> dt.datetime | None:
    """Slurm's time as Slurm keeps it: whole seconds, cut short (not after `now`).

    The instant it names lies in [S, S+1). Slurm's accounting (ElapsedRaw = End - Start) is
    made of these seconds, so the ledger keeps them as the engine's own times and bills
    within them (`jobs.ledger.clocks`); reading End as S+1 billed up to a second more than
    Slurm per attempt and GPU (issue 50).
    """
    number = _int(value)
    if not number:
        return None
    return min(dt.datetime.fromtimestamp(number, dt.UTC), now)


def _int(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None
