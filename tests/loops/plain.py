"""A scheduler tick's snapshot as plain data, made by hand: teams and clusters are unsaved rows,
jobs are `Queued` and `Active` records, so the admission's steps are tested without a database."""

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence

from jobs.executors import Capacity, NodeCapacity
from jobs.loops.snapshot import Active, Queued, Snapshot
from jobs.models import Cluster, Team

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)  # a Wednesday
CLUSTER = 7


def team(pk: int, name: str, quota: int = 8, **fields) -> Team:
    return Team(pk=pk, name=name, gpu_quota=quota, **fields)


def cluster(gpus: int = 16, pk: int = CLUSTER, name: str = "gpu", **fields) -> tuple:
    """A cluster and its capacity, as the capacities of a snapshot hold them."""
    capacity = Capacity(**({"reachable": True, "total_gpus": gpus} | fields))
    return Cluster(pk=pk, name=name, kind="noop"), capacity


def nodes(*spec: tuple[str, int, str], pk: int = CLUSTER) -> tuple:
    """A cluster that reports its nodes (name, GPUs, type)."""
    made = tuple(NodeCapacity(name, gpus, kind) for name, gpus, kind in spec)
    return cluster(sum(n.gpus for n in made), pk=pk, nodes=made)


def queued(pk: int, team: Team, total_gpus: int = 1, user: int = 1, **fields) -> Queued:
    row = {"username": f"user{user}", "cluster": CLUSTER, "window": None, "old_reason": ""}
    return Queued(id=pk, team=team.pk, user=user, total_gpus=total_gpus, **(row | fields))


def active(pk: int, team: Team, total_gpus: int = 1, user: int = 1, **fields) -> Active:
    row = {
        "cluster": CLUSTER, "nodes": 1, "gpu_type": "", "array": None, "time_limit_s": None,
        "attempt": 1000 + pk, "started": NOW - dt.timedelta(hours=1), "admitted": None,
        "preempted": None, "lender": None,
    }  # fmt: skip
    return Active(id=pk, team=team.pk, user=user, total_gpus=total_gpus, **(row | fields))


def snapshot(
    teams: list[Team],
    queue: Sequence[Queued] = (),
    running: Sequence[Active] = (),
    clusters: list[tuple] | None = None,
    **fields,
) -> Snapshot:
    """A snapshot at NOW of these teams, queued jobs (in the queue's order) and active jobs, on
    one 16-GPU cluster unless `clusters` says otherwise."""
    by_team: dict[int, list[Queued]] = defaultdict(list)
    for job in queue:
        by_team[job.team].append(job)
    capacities = {c.pk: (c, cap) for c, cap in clusters or [cluster()]}
    row = {
        "now": NOW, "teams": {t.pk: t for t in teams}, "windows": {}, "month_us": {},
        "capacities": capacities, "cluster_windows": {pk: None for pk in capacities},
        "shares": {}, "type_caps": {}, "queue": dict(by_team), "active": list(running),
        "array_tasks": {}, "recent_us": {},
    }  # fmt: skip
    return Snapshot(**(row | fields))
