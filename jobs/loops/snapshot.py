"""What one scheduler tick decides from, read up front as plain data; nothing here decides.

In the order a tick reads it: the engines' capacities (`cluster_capacities`, asked outside any
transaction; what job reads show of a cluster's health is recorded here), then, inside the
tick's turn, the rules (`Rules`: the teams, the schedule windows, the month's usage where a team
has a budget), which the tick's writing steps act on first, and then the rest (`Snapshot`): the
clusters' windows and shares, the teams' caps per GPU type, the queue in one query, the active
jobs in one query, and the teams' recent usage where two teams or more wait (fair share).

The active jobs are read once, a row each: what teams, members and clusters hold
(`jobs.loops.holdings`), the nodes and GPU types they hold (`jobs.loops.placement`), until when
(`jobs.loops.reservations`, the queue plan) and how many tasks of each capped array run are all
worked out from those rows in memory, so a tick's queries do not grow with what it meets. Most
ticks needed those rows anyway (every tick that plans the queue, or makes a reservation, read
them); one that does neither reads a row per active job where a grouped query once sufficed, and
one with nothing queued reads none. The one read left to a tick's decisions is lending's
(`jobs.loops.lending`: the borrowers of a lender whose job wants its GPUs back).
"""

import datetime as dt
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from django.conf import settings
from django.utils import timezone

from jobs.executors import Capacity, executor_for
from jobs.executors.base import preempt_grace_s
from jobs.gpus import to_gpus_per_node
from jobs.loops.budgets import month_cost, month_usage
from jobs.loops.fairshare import recent_usage
from jobs.loops.windows import read_windows
from jobs.models import Cluster, ClusterShare, Job, Team, TeamGpuTypeQuota
from jobs.states import JobStatus
from jobs.windows import Window

log = logging.getLogger(__name__)
S = JobStatus

# The clusters a tick may place jobs on, each with what its engine said it has now.
Capacities = dict[int, tuple[Cluster, Capacity]]


class Queued(NamedTuple):
    """A QUEUED job, as a tick offers it (the queue's order: priority, then submit time)."""

    id: int
    team: int
    user: int
    username: str
    cluster: int
    total_gpus: int
    window: int | None
    old_reason: str
    nodes: int = 1
    gpu_type: str = ""
    time_limit_s: int | None = None
    queued_at: dt.datetime | None = None
    array: int | None = None
    array_cap: int | None = None  # the array's --max-parallel
    avoid_nodes: list[str] | None = None  # where its hung attempts ran (`Job.avoid_nodes`)

    @property
    def gpus_per_node(self) -> int:
        return to_gpus_per_node(self.total_gpus, self.nodes)


class Active(NamedTuple):
    """A job that holds its place (SUBMITTED, PENDING, RUNNING), with its current attempt's
    clocks, lender and, where a cluster reports its nodes, the nodes its ranks were seen on."""

    id: int
    team: int
    user: int
    cluster: int
    total_gpus: int
    nodes: int
    gpu_type: str
    array: int | None
    time_limit_s: int | None
    attempt: int | None
    started: dt.datetime | None
    admitted: dt.datetime | None
    preempted: dt.datetime | None
    lender: int | None
    ranks: list | None = None
    avoid_nodes: list[str] | None = None  # where its hung attempts ran (`Job.avoid_nodes`)

    @property
    def gpus_per_node(self) -> int:
        return to_gpus_per_node(self.total_gpus, self.nodes)


@dataclass(frozen=True)
class Rules:
    """What the tick's rules read before its writing steps act on them: every team, the schedule
    windows that parse, and each team's GPU-µs this month (only where some team has a budget)
    and its cost in micro-units (only where some team has a money budget)."""

    teams: dict[int, Team]
    windows: dict[int, Window]
    month_us: dict[int, int]
    month_cost: dict[int, int] = field(default_factory=dict)


def read_rules(now: dt.datetime) -> Rules:
    teams = {t.pk: t for t in Team.objects.all()}
    return Rules(teams, read_windows(), month_usage(teams, now), month_cost(teams, now))


@dataclass(frozen=True)
class Snapshot:
    """Everything a tick's admission decides from (see the module's docstring)."""

    now: dt.datetime
    teams: dict[int, Team]
    windows: dict[int, Window]
    month_us: dict[int, int]
    capacities: Capacities
    cluster_windows: dict[int, int | None]  # every cluster's window, the disabled ones' too
    shares: dict[tuple[int, int], int]  # (team, cluster) -> percent
    type_caps: dict[int, dict[str, int]]  # team -> GPU type -> GPUs (TeamGpuTypeQuota)
    queue: dict[int, list[Queued]]  # per team, in the queue's order
    active: list[Active]  # in id order
    array_tasks: dict[int, int]  # active tasks of each array a queued task's --max-parallel caps
    recent_us: dict[int, int]  # GPU-µs per team over the fair-share days
    month_cost: dict[int, int] = field(default_factory=dict)  # micro-units per team

    def grace_s(self, cluster: int) -> int:
        """The cluster's preemption grace."""
        cap = self.capacities.get(cluster)
        return preempt_grace_s(cap[0].settings) if cap else settings.SF_PREEMPT_GRACE_S


def read_snapshot(now: dt.datetime, rules: Rules, capacities: Capacities) -> Snapshot:
    """The rest of what the tick decides from, read once its writing steps have run."""
    cluster_windows: dict[int, int | None] = dict(Cluster.objects.values_list("pk", "window_id"))
    shares = {(s.team_id, s.cluster_id): s.percent for s in ClusterShare.objects.all()}
    type_caps = read_type_caps()
    queue = read_queue()
    # An empty queue weighs nothing against what runs (nor does its plan): no row is read.
    active = read_active(ranks=any(c.nodes for _, c in capacities.values())) if queue else []
    capped = {j.array for jobs in queue.values() for j in jobs if j.array_cap is not None}
    tasks = Counter(a.array for a in active if a.array is not None and a.array in capped)
    return Snapshot(
        now=now,
        teams=rules.teams,
        windows=rules.windows,
        month_us=rules.month_us,
        month_cost=rules.month_cost,
        capacities=capacities,
        cluster_windows=cluster_windows,
        shares=shares,
        type_caps=type_caps,
        queue=queue,
        active=active,
        array_tasks=dict(tasks),
        recent_us=recent_usage(now) if len(queue) >= 2 else {},
    )


def read_queue() -> dict[int, list[Queued]]:
    """Every QUEUED job in one query, per team, highest priority first, then the oldest."""
    queue: dict[int, list[Queued]] = defaultdict(list)
    rows = (
        Job.objects.filter(status=S.QUEUED)
        .order_by("-priority", "submitted_at", "id")
        .values_list(
            "id", "team_id", "user_id", "user__username", "cluster_id", "total_gpus", "window_id",
            "status_reason", "nodes", "gpu_type", "time_limit_s", "status_changed_at",
            "array_id", "array__max_parallel", "avoid_nodes",
        )
    )  # fmt: skip
    for row in rows:
        queue[row[1]].append(Queued(*row))
    return dict(queue)


def read_active(ranks: bool) -> list[Active]:
    """Every active job in one query; with `ranks`, the nodes its ranks were seen on and those
    it keeps off too (read only where some cluster reports its nodes: they are lists per job)."""
    columns = [
        "pk", "team_id", "user_id", "cluster_id", "total_gpus", "nodes", "gpu_type", "array_id",
        "time_limit_s", "current_attempt_id", "current_attempt__start_time",
        "current_attempt__submitted_at", "current_attempt__preempted_at",
        "current_attempt__borrowed_from",
    ]  # fmt: skip
    if ranks:
        columns += ["current_attempt__ranks", "avoid_nodes"]
    rows = Job.objects.filter(status__in=S.active()).order_by("pk").values_list(*columns)
    return [Active(*row) for row in rows]


def read_type_caps() -> dict[int, dict[str, int]]:
    caps: dict[int, dict[str, int]] = defaultdict(dict)
    for team, kind, gpus in TeamGpuTypeQuota.objects.values_list("team_id", "gpu_type", "gpus"):
        caps[team][kind] = gpus
    return dict(caps)


def cluster_capacities() -> Capacities:
    """Ask every enabled cluster's engine what it has, now; record who cannot be reached."""
    capacities = {}
    for cluster in Cluster.objects.filter(enabled=True):
        try:
            capacity = executor_for(cluster).capacity()
        except Exception as exc:  # one broken engine must not stop the tick for the others
            log.exception("capacity of cluster %s failed", cluster.name)
            capacity = Capacity(reachable=False, message=f"{type(exc).__name__}: {exc}")
        capacities[cluster.pk] = (cluster, capacity)
        _record_health(cluster, capacity)
    return capacities


def _record_health(cluster: Cluster, capacity: Capacity) -> None:
    """What job reads show of the cluster (reachability, virtual GPUs); only changes are
    written."""
    if capacity.reachable:
        seen: dict = {}
        if cluster.gpus_virtual != capacity.virtual:
            seen["gpus_virtual"] = capacity.virtual
        if cluster.unreachable_since:
            seen |= {"unreachable_since": None, "unreachable_reason": ""}
        if seen:
            Cluster.objects.filter(pk=cluster.pk).update(**seen)
        return
    reason = capacity.message or "no reason given"
    if cluster.unreachable_since is None or cluster.unreachable_reason != reason:
        Cluster.objects.filter(pk=cluster.pk).update(
            unreachable_since=cluster.unreachable_since or timezone.now(),
            unreachable_reason=reason,
        )
