"""Why a QUEUED job cannot be admitted now, in words and numbers a user understands.

The gates, in the order a job meets them: its array's --max-parallel; the time and budget rules
(a closed window: the job's own, else its team's, or its cluster's, `jobs.loops.windows`; the
team's GPUs per job; a used-up budget, GPU-hours or money, `jobs.loops.budgets`); the team's
slots and GPU quota (past which a job may borrow a lendable team's idle GPUs, or a lender's job
takes lent GPUs back: `jobs.loops.lending`), its per-member cap and its caps per GPU type; the
cluster (disabled, unreachable, its free GPUs, its job cap, the team's share of it); and, where
the cluster reports its nodes, a node with room for every rank (`jobs.loops.placement`). A reason
the queue plan models is `Planned`; no room on the cluster is `NoRoom`, the wait a reservation
is made for.

Gates read the tick's snapshot and tally and write nothing but lending's decisions (whom a job
borrows from, the notices), which the tick writes after.
"""

from jobs.loops import budgets, lending
from jobs.loops.placement import Placement, kept_off
from jobs.loops.queueplan import Planned
from jobs.loops.reservations import NoRoom
from jobs.loops.snapshot import Queued, Snapshot
from jobs.loops.tally import Tally
from jobs.loops.windows import closed_window
from jobs.models import Team


def gate(snap: Snapshot, tally: Tally, job: Queued) -> tuple[str | None, list[str] | None]:
    """Why this job cannot be admitted now (None: it can), and the nodes its ranks would take
    where the cluster reports its nodes."""
    team = snap.teams[job.team]
    reason = (
        _array_gate(tally, job)
        or _rules_gate(snap, team, job)
        or _quota_gate(snap, tally, team, job)
        or _cluster_gate(snap, tally, team, job)
    )
    if reason is not None:
        return reason, None
    return _node_gate(snap, tally.placement, job)


def _array_gate(tally: Tally, job: Queued) -> str | None:
    """A task of an array already running its --max-parallel tasks waits. The words do not
    count them, so the reason stays the same (and unwritten) tick after tick."""
    if job.array is None or job.array_cap is None:
        return None
    if tally.array_tasks.get(job.array, 0) < job.array_cap:
        return None
    return (
        f"waiting for its array: at most {job.array_cap} of array {job.array}'s tasks run at "
        "once (--max-parallel)"
    )


def _rules_gate(snap: Snapshot, team: Team, job: Queued) -> str | None:
    """A closed window, the team's GPUs per job, a used-up budget."""
    closed = closed_window(
        snap.windows, snap.now, job.window or team.window_id, snap.cluster_windows.get(job.cluster)
    )
    if closed is not None:
        return closed.describe_wait(snap.now)
    if team.max_gpus_per_job is not None and job.total_gpus > team.max_gpus_per_job:
        return (
            f"waiting for quota: team {team.name} allows at most {team.max_gpus_per_job} "
            f"GPUs per job; this job needs {job.total_gpus}"
        )
    used_us, spent = snap.month_us.get(team.pk, 0), snap.month_cost.get(team.pk, 0)
    return budgets.held_back(team, job.total_gpus, used_us, snap.now, spent)


def _quota_gate(snap: Snapshot, tally: Tally, team: Team, job: Queued) -> str | None:
    """The team's slots, its GPU quota (or what it may borrow past it), its per-member cap and
    its caps per GPU type."""
    held = tally.held.team[team.pk]
    if team.max_jobs is not None and held.jobs >= team.max_jobs:
        return (
            f"waiting for a slot: team {team.name} runs {held.jobs} of the "
            f"{team.max_jobs} jobs it may run at once"
        )
    if held.total_gpus + job.total_gpus > team.gpu_quota:
        past = _past_quota(tally, team, job)
        if past is not None:
            return past
    member = tally.held.member[(team.pk, job.user)]
    if team.user_gpu_cap is not None and member.total_gpus + job.total_gpus > team.user_gpu_cap:
        return (
            f"waiting for quota: {job.username} uses {member.total_gpus} of the "
            f"{team.user_gpu_cap} GPUs team {team.name} allows one member; "
            f"this job needs {job.total_gpus}"
        )
    for cap in tally.placement.caps_matching(team.pk, job.gpu_type):
        used, limit = tally.placement.type_use(team.pk, cap), snap.type_caps[team.pk][cap]
        if used + job.total_gpus > limit:
            return (
                f"waiting for quota: team {team.name} uses {used} of its {limit} {cap} GPUs; "
                f"this job needs {job.total_gpus}"
            )
    return None


def _past_quota(tally: Tally, team: Team, job: Queued) -> str | None:
    """A job past its team's quota borrows (None: the lender is noted for the tick), or waits:
    for lent GPUs to come back (a lender's job, its borrowers told), or for quota."""
    lender = lending.lender(tally.lending, tally.held, team, job.total_gpus)
    if lender is not None:
        tally.lending.borrowing[job.id] = lender.pk
        return None
    taking = lending.take_back(tally.lending, tally.held, team, job.id, job.user, job.total_gpus)
    if taking is not None:
        return Planned(taking)
    held = tally.held.team[team.pk]
    return Planned(
        f"waiting for quota: team {team.name} uses {held.total_gpus} of "
        f"{team.gpu_quota} GPUs; this job needs {job.total_gpus}"
        + lending.borrow_words(tally.held, team, job.total_gpus)
    )


def _cluster_gate(snap: Snapshot, tally: Tally, team: Team, job: Queued) -> str | None:
    """The cluster: enabled, reachable, GPUs free, its job cap, the team's share of it."""
    cap = snap.capacities.get(job.cluster)
    if cap is None:
        return "waiting for capacity: the job's cluster is disabled"
    cluster, capacity = cap
    if not capacity.reachable:
        return f"waiting for cluster {cluster.name}: it cannot be reached ({capacity.message})"
    used = tally.held.cluster[cluster.pk]
    free = capacity.total_gpus - used.total_gpus
    kind = "virtual GPU slots" if capacity.virtual else "GPUs"
    if job.total_gpus > free:
        why = f" ({capacity.message})" if capacity.message else ""  # e.g. every node drained
        return NoRoom(
            f"waiting for capacity: cluster {cluster.name} has {max(free, 0)} of "
            f"{capacity.total_gpus} {kind} free{why}; this job needs {job.total_gpus}"
        )
    if capacity.max_jobs is not None and used.jobs >= capacity.max_jobs:
        return (
            f"waiting for capacity: cluster {cluster.name} runs {used.jobs} of "
            f"{capacity.max_jobs} jobs it allows at once"
        )
    percent = snap.shares.get((team.pk, cluster.pk))
    if percent is not None and job.total_gpus:
        limit = capacity.total_gpus * percent // 100
        mine = tally.held.team_cluster[(team.pk, cluster.pk)].total_gpus
        if mine + job.total_gpus > limit:
            return (
                f"waiting for share: team {team.name} holds {mine} of its {limit} {kind} "
                f"on cluster {cluster.name} ({percent}% of {capacity.total_gpus}); "
                f"this job needs {job.total_gpus}"
            )
    return None


def _node_gate(
    snap: Snapshot, placement: Placement, job: Queued
) -> tuple[str | None, list[str] | None]:
    """Gang admission: every rank of the job on a node with room for it, all at once; never
    a cluster sum (2 x 4 GPUs does not start on 3 + 3 + 2 free)."""
    cluster, capacity = snap.capacities[job.cluster]
    if not capacity.nodes:
        return None, None  # one pool: the sum was the whole check
    nodes = placement.nodes_of(job.cluster)
    g, kind = job.gpus_per_node, job.gpu_type
    avoid = placement.full_types(job) if not kind else frozenset()
    off = kept_off(capacity, job)
    placed = nodes.place(job.nodes, g, kind, avoid, off)
    if placed is not None:
        return None, placed
    have = nodes.room(job.nodes, g, kind, avoid, off)
    what = f"{g} free {kind + ' ' if kind else ''}GPU{'s' if g != 1 else ''}"
    hung = f" (kept off {', '.join(sorted(off))}, where an attempt of it hung)" if off else ""
    if nodes.share:
        return NoRoom(
            f"waiting for capacity: {job.nodes} rank{'s' if job.nodes != 1 else ''} with {what} "
            f"each on cluster {cluster.name}: room for {have} now{hung}"
        ), None
    return NoRoom(
        f"waiting for {job.nodes} node{'s' if job.nodes != 1 else ''} with {what}"
        f"{' each' if job.nodes != 1 else ''}: {have} such node{'s' if have != 1 else ''} free "
        f"on cluster {cluster.name}{hung}"
    ), None
