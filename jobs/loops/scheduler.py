"""The scheduler tick: admit QUEUED jobs through the window, budget, quota, share and capacity
gates, in fair-share order between teams.

One tick reads the whole queue in one query, keeps running sums per team, member, cluster and
team-on-cluster in memory, and writes admissions and waiting reasons in batches, so its query
count does not grow with the queue. Ticks take turns (a PostgreSQL advisory lock held for the
tick's transaction; a lock file beside the embedded ledger, whose tick reads and decides outside
the database's write lock and then writes), so two schedulers at once never over-admit: the
second one finds the turn taken and skips its tick.

Fair share: the queue is offered team by team. A team's score is its GPU-hours over the last
`FAIR_SHARE_DAYS` days plus the GPUs it holds now (each counted as an hour), divided by its GPU
quota; the team with the lowest score places its next job (highest priority, then oldest), its
score grows by that job's GPUs / quota, and the offer goes to the lowest score again. Priority
therefore orders jobs only within a team.

No starvation: the first job of a cluster's order that finds no room gets a reservation (EASY
backfill): the GPUs the plan says come back first, from when they do. A job behind it that fits
now starts only if its time limit ends before then, or if the reserved job would still have
its GPUs then; one without a time limit also while the reserved job is younger than
SF_RESERVE_AGE_S. A tick also plans the whole queue it considered (`jobs.loops.queueplan`):
where every waiting job stands and when it can start; at most once per QUEUE_PLAN_EVERY_S, as
working the plan out costs as much as the rest of a tick over a long backlog, and under a
stream of submits kicked ticks come every second or so.

Lending: a job past its team's quota may borrow a lendable team's idle GPUs, and a lendable
team's job that lent GPUs keep out preempts their borrowers; `jobs.loops.lending` decides both,
and the tick writes its notices through `jobs.ledger.preemption`, which also queues the jobs a
preemption paused again at the start of the next tick.

The same tick applies the two time-driven rules: jobs submitted with `--window-policy pause`
are paused when their window closes and queued again when it reopens, and a team whose monthly
budget is used up with `budget_hard_stop` set has its running GPU jobs stopped. Before it
admits, it stops the QUEUED jobs whose submitter may no longer submit in the job's team
(removed, made a viewer, deactivated: `jobs.ledger.departures`).
"""

import bisect
import contextlib
import datetime as dt
import heapq
import logging
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, OuterRef, Subquery
from django.utils import timezone
from sf.contract import backend_name

from jobs.executors import Capacity, executor_for, gpu_type_matches
from jobs.executors.base import preempt_grace_s
from jobs.ledger import clocks, preemption
from jobs.ledger.batches import write_batches
from jobs.ledger.departures import stop_outsiders
from jobs.ledger.halt import halt
from jobs.ledger.lifecycle import requeue_due_retries
from jobs.ledger.transitions import Change, apply_transitions
from jobs.ledger.ungranted import stop_ungranted
from jobs.loops import lending, queueplan
from jobs.loops.holdings import Holdings, read_holdings
from jobs.loops.lending import Lending
from jobs.models import (
    Attempt,
    Cluster,
    ClusterShare,
    Job,
    ScheduleWindow,
    Team,
    TeamGpuTypeQuota,
)
from jobs.states import JobStatus
from jobs.stores import queueplan as store_plan
from jobs.windows import Window, WindowSpecError, parse_window
from metering.records import meter_ended, team_gpu_us
from metering.usage import US_PER_HOUR
from starforge.db.sqlite3.base import turn as sqlite_turn

log = logging.getLogger(__name__)
S = JobStatus
ADVISORY_LOCK_KEY = 0x5F5C_4ED0  # any constant unique to Starforge's scheduler
# Bounds one tick's transaction; the next tick (kicked right away by the task) goes on.
MAX_ADMIT_PER_TICK = 5000
# A tick plans the queue when the kept plan is at least this old (or missing): beat's ticks
# come every 2 s, so places are at most one beat's interval and a tick behind the ledger. A job
# queued since the plan reads as not placed yet (`jobs.reads.queue`).
QUEUE_PLAN_EVERY_S = 1.5
FAIR_SHARE_DAYS = 7


class Planned(str):
    """A waiting reason the queue plan models (the team's GPU quota, the cluster's GPUs), so
    it can say when the job starts; for any other (a closed window, a used-up budget, a
    member's cap, a share, an unreachable cluster) it gives no estimate and says why."""


class NoRoom(Planned):
    """The cluster has not the GPUs (or nodes) free: the wait a reservation is made for."""


@dataclass
class _Reservation:
    """GPUs of a cluster kept for the first job of its order that does not fit (EASY backfill,
    as Slurm's backfill scheduler): from `start`, when the plan says enough come back (None:
    unknown, some are held by jobs without a time limit), for `job`."""

    job: "_Queued"
    start: float | None
    old: bool  # waited past SF_RESERVE_AGE_S: jobs without a time limit may not pass it
    free: "queueplan.Profile"  # the cluster's free GPUs over time, this tick's admissions in


@dataclass
class TickResult:
    skipped: bool = False
    admitted: list[int] = field(default_factory=list)  # attempt ids to launch
    waiting: int = 0
    paused: list[int] = field(default_factory=list)  # paused because their window closed
    resumed: list[int] = field(default_factory=list)  # queued again as their window opened
    stopped: list[int] = field(default_factory=list)  # stopped by a budget hard stop
    preempted: list[int] = field(default_factory=list)  # told to give borrowed GPUs back
    requeued: list[int] = field(default_factory=list)  # queued again after a preemption
    outsiders: list[int] = field(default_factory=list)  # stopped: submitter may not submit now
    ungranted: list[int] = field(default_factory=list)  # stopped: team's cluster grant revoked


@dataclass(frozen=True)
class _Queued:
    id: int
    team: int
    user: int
    username: str
    cluster: int
    gpus: int
    window: int | None
    old_reason: str
    nodes: int = 1
    gpu_type: str = ""
    time_limit_s: int | None = None
    queued_at: dt.datetime | None = None
    array: int | None = None
    array_cap: int | None = None  # the array's --max-parallel

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // max(self.nodes, 1)


class _Nodes:
    """A cluster's nodes as one tick sees them: the GPUs free on each, less what Starforge's
    active jobs hold there (on the nodes the engine reported for their ranks, else where they
    would be placed), less what this tick admitted.

    Within a tick free GPUs only shrink, so a gang shape that did not fit once cannot fit
    later in the tick: `place` remembers it, and a deep queue of one shape costs one scan."""

    def __init__(self, capacity: Capacity) -> None:
        self.free = {n.name: n.gpus for n in capacity.nodes}
        self.types = {n.name: n.gpu_type for n in capacity.nodes}
        self.share = capacity.ranks_share_nodes
        # shape -> ranks that had room, when too few did
        self.misses: dict[tuple[int, int, str, frozenset[str]], int] = {}
        self.where: dict[int, list[str]] = {}  # active job -> the nodes its ranks hold

    def place(
        self, ranks: int, gpus: int, gpu_type: str, avoid: frozenset[str] = frozenset()
    ) -> list[str] | None:
        """The nodes (one per rank) a gang of `ranks` x `gpus` would take now, or None; never
        a node whose type matches one in `avoid`. Best fit: the nodes with the least room that
        still fits go first, so whole nodes stay free for the next gang."""
        shape = (ranks, gpus, gpu_type, avoid)
        if shape in self.misses:
            return None
        fits = [
            (free, name)
            for name, free in self.free.items()
            if free >= gpus
            and gpu_type_matches(gpu_type, self.types[name])
            and not any(gpu_type_matches(a, self.types[name]) for a in avoid)
        ]
        chosen: list[str] = []
        for free, name in heapq.nsmallest(ranks, fits) if not self.share else sorted(fits):
            room = (free // gpus if gpus else ranks) if self.share else 1
            chosen += [name] * min(room, ranks - len(chosen))
            if len(chosen) == ranks:
                return chosen
        self.misses[shape] = len(chosen) if self.share else len(fits)
        return None

    def room(self, ranks: int, gpus: int, gpu_type: str, avoid: frozenset[str]) -> int:
        """How many ranks of that shape had room when `place` last found too few."""
        return self.misses.get((ranks, gpus, gpu_type, avoid), 0)

    def take(self, names: list[str], gpus: int) -> None:
        for name in names:
            if name in self.free:
                self.free[name] -= gpus


@dataclass
class _Context:
    now: dt.datetime
    teams: dict[int, Team]
    windows: dict[int, Window]
    cluster_windows: dict[int, int | None]
    capacities: dict[int, tuple[Cluster, Capacity]]
    shares: dict[tuple[int, int], int]  # (team, cluster) -> percent
    month_us: dict[int, int]  # GPU-µs used this month per team (only teams with a budget)
    held: Holdings
    nodes: dict[int, _Nodes] = field(default_factory=dict)  # per cluster reporting its nodes
    # Teams' caps per GPU type (TeamGpuTypeQuota), and what they hold of each (filled on first
    # use: it places the active jobs of the clusters that report nodes).
    type_caps: dict[int, dict[str, int]] = field(default_factory=dict)
    type_used: dict[tuple[int, str], int] | None = None
    reservations: dict[int, _Reservation] = field(default_factory=dict)  # per cluster
    # What active jobs hold and until when (read once, when the first reservation or the plan
    # needs it), and what this tick admitted.
    holdings: list[queueplan.Holding] | None = None
    admitted: list[queueplan.Holding] = field(default_factory=list)
    # Active tasks per array with a --max-parallel (read when the first such task is met).
    array_active: dict[int, int] | None = None
    lending: Lending = field(init=False)  # who borrows, whom this tick preempts

    def __post_init__(self) -> None:
        self.lending = Lending(self.now, self.teams, self.grace_s, set(self.capacities))

    def active_tasks(self, array: int) -> int:
        if self.array_active is None:
            self.array_active = _array_active()
        return self.array_active.get(array, 0)

    def took_task(self, array: int) -> None:
        active = self.active_tasks(array)
        assert self.array_active is not None  # read by active_tasks
        self.array_active[array] = active + 1

    def grace_s(self, cluster: int) -> int:
        cap = self.capacities.get(cluster)
        return preempt_grace_s(cap[0].settings) if cap else settings.SF_PREEMPT_GRACE_S

    def all_holdings(self) -> list[queueplan.Holding]:
        if self.holdings is None:
            self.holdings = _active_holdings(self.now.timestamp(), self.grace_s)
        return self.holdings + self.admitted

    def nodes_of(self, cluster: Cluster, capacity: Capacity) -> _Nodes:
        if cluster.pk not in self.nodes:
            self.nodes[cluster.pk] = _held_nodes(cluster, capacity)
        return self.nodes[cluster.pk]

    def caps_matching(self, team: int, gpu_type: str) -> list[str]:
        """The team's capped types that GPUs of `gpu_type` count toward."""
        caps = self.type_caps.get(team)
        if not caps or not gpu_type:
            return []
        return [c for c in caps if gpu_type_matches(c, gpu_type) or gpu_type_matches(gpu_type, c)]

    def _used(self) -> dict[tuple[int, str], int]:
        if self.type_used is None:
            self.type_used = _type_use(self)
        return self.type_used

    def type_use(self, team: int, cap: str) -> int:
        return self._used().get((team, cap), 0)

    def count_type_use(self, team: int, gpu_type: str, gpus: int) -> None:
        used = self._used()
        for cap in self.caps_matching(team, gpu_type):
            used[(team, cap)] = used.get((team, cap), 0) + gpus


def admit_queued_jobs(now: dt.datetime | None = None) -> TickResult:
    """One scheduler tick. Safe to run concurrently and repeatedly: one tick at a time has the
    turn (`_turn`); a tick that finds it taken skips."""
    now = now or timezone.now()
    requeue_due_retries(now)  # cooled-down FAILED jobs join this tick's queue
    meter_ended()  # usage records current before budgets and fair share read them
    capacities = _cluster_capacities()  # asks the engines, outside any transaction
    with _turn() as writing:
        if writing is None:
            return TickResult(skipped=True)
        teams = {t.pk: t for t in Team.objects.all()}
        windows = _windows()
        month_us = _month_usage(teams, now)
        with writing():
            stopped = _hard_stops(teams, month_us, now)
            paused, resumed = _apply_window_policy(now, teams, windows)
            requeued = preemption.requeue()
            outsiders = stop_outsiders(now)  # last: the steps above may have queued theirs
            ungranted = stop_ungranted(now)  # after them too, for the same reason
        decided = _decide(now, teams, windows, capacities, month_us)
        result = _record(decided, writing)
    result.stopped, result.paused, result.resumed = stopped, paused, resumed
    result.requeued, result.outsiders = requeued, outsiders
    result.ungranted = ungranted
    return result


@contextlib.contextmanager
def _turn() -> Iterator[Callable[[], contextlib.AbstractContextManager] | None]:
    """The tick's turn: None while another tick has it; inside, what each of the tick's writing
    steps runs in.

    On PostgreSQL one transaction holds an advisory lock, and every step runs inside it. On the
    embedded ledger a lock file of its own is the turn (`starforge.db.sqlite3.turn`) and each
    writing step is a transaction of its own: the database's write lock, which every submit
    waits for, is held while the tick writes, not while it reads the queue and decides (tens of
    milliseconds; several times that while the web workers keep the cores busy). What the
    tick decided on still holds when it writes: only a tick admits, and only one has the turn,
    so what the active jobs hold can only have shrunk meanwhile; a job that left the queue
    meanwhile (stopped, deleted) is not admitted, as every write of the tick expects QUEUED."""
    if connection.vendor == "postgresql":
        with transaction.atomic():
            yield contextlib.nullcontext if _take_advisory_lock() else None
        return
    with sqlite_turn("scheduler") as mine:
        if mine is None:  # an in-memory database: one process, one transaction
            with transaction.atomic():
                yield contextlib.nullcontext
        else:
            yield transaction.atomic if mine else None


@dataclass
class _Decided:
    """What a tick decided, to be written: admissions, new waiting reasons, the waiting jobs in
    the order considered (the queue plan's order), and whether it considered every job."""

    ctx: _Context
    admit: list["_Admission"]
    reasons: dict[str, list[int]]
    waiting: list[queueplan.Waiting]
    considered_all: bool


def _decide(
    now: dt.datetime,
    teams: dict[int, Team],
    windows: dict[int, Window],
    capacities: dict[int, tuple[Cluster, Capacity]],
    month_us: dict[int, int],
) -> _Decided:
    """Offer the queue in fair-share order through the gates; reads only."""
    ctx = _Context(
        now=now,
        teams=teams,
        windows=windows,
        cluster_windows=dict(Cluster.objects.values_list("pk", "window_id")),
        capacities=capacities,
        shares={(s.team_id, s.cluster_id): s.percent for s in ClusterShare.objects.all()},
        month_us=month_us,
        held=read_holdings(),
        type_caps=_type_caps(),
    )
    queue: dict[int, deque[_Queued]] = defaultdict(deque)
    rows = (
        Job.objects.filter(status=S.QUEUED)
        .order_by("-priority", "submitted_at", "id")
        .values_list(
            "id", "team_id", "user_id", "user__username", "cluster_id", "gpus", "window_id",
            "status_reason", "nodes", "gpu_type", "time_limit_s", "status_changed_at",
            "array_id", "array__max_parallel",
        )
    )  # fmt: skip
    for row in rows:
        queue[row[1]].append(_Queued(*row))
    ctx.lending.wanting = {team for team, jobs in queue.items() if any(j.gpus for j in jobs)}
    admit: list[_Admission] = []
    reasons: dict[str, list[int]] = defaultdict(list)
    waiting: list[queueplan.Waiting] = []  # in the order considered: the queue plan's order
    considered_all = True
    turn = _fair_share_order(ctx, list(queue))
    while turn:
        score, team_id = heapq.heappop(turn)
        job = queue[team_id].popleft()
        reason, placed = _gate(ctx, job)
        if reason is None:
            reason = _reserved_for_another(ctx, job)
        elif isinstance(reason, NoRoom):
            _reserve(ctx, job)
        if reason is None:
            if len(admit) >= MAX_ADMIT_PER_TICK:
                considered_all = False  # the next tick plans the queue
                break
            _hold(ctx, job, placed)
            _took(ctx, job)
            if job.array_cap is not None and job.array is not None:
                ctx.took_task(job.array)
            ctx.held.add(job.team, job.user, job.cluster, job.gpus)
            lender = ctx.lending.borrowing.get(job.id)
            if lender is not None:
                ctx.held.lend(job.team, lender, job.gpus)
            admit.append((job.id, job.gpus, lender, _admission_record(ctx, job, lender)))
            score += job.gpus / max(ctx.teams[team_id].gpu_quota, 1)
        else:
            if reason != job.old_reason:
                reasons[reason].append(job.id)
            blocked = "" if isinstance(reason, Planned) else reason
            waiting.append(
                queueplan.Waiting(
                    job.id, job.team, job.cluster, job.gpus, job.time_limit_s, blocked
                )
            )
        if queue[team_id]:
            heapq.heappush(turn, (score, team_id))
    return _Decided(ctx, admit, reasons, waiting, considered_all)


def _record(
    decided: _Decided, writing: Callable[[], contextlib.AbstractContextManager]
) -> TickResult:
    """Write what the tick decided: waiting reasons, admissions, preemption notices, each step
    in `writing()`, and the admissions in batches (`jobs.ledger.batches`)."""
    ctx = decided.ctx
    if decided.reasons:
        with writing():
            for reason, ids in decided.reasons.items():
                # A waiting reason is not a status change: no event, and only QUEUED rows are
                # touched.
                Job.objects.filter(pk__in=ids, status=S.QUEUED).update(status_reason=reason)
    attempt_ids: list[int] = []
    for batch in write_batches(decided.admit):
        with writing():
            attempt_ids += _submit(batch, ctx.now)
    preempted: list[int] = []
    if ctx.lending.notices:
        clusters = {pk: cluster for pk, (cluster, _) in ctx.capacities.items()}
        with writing():
            preempted = preemption.send_notices(ctx.lending.notices, clusters, ctx.now)
    if decided.considered_all and _plan_due(ctx.now.timestamp()):
        # Worked out and kept once the tick's writes have committed (at once on the embedded
        # ledger, where they have): there their transactions hold the database's write lock,
        # which submits wait for.
        plan = _planner(ctx, decided.waiting)
        at = ctx.now.timestamp()
        transaction.on_commit(lambda: _keep_plan(plan, at), robust=True)
    return TickResult(
        admitted=attempt_ids,
        waiting=sum(len(v) for v in decided.reasons.values()),
        preempted=preempted,
    )


def _planner(ctx: _Context, waiting: list[queueplan.Waiting]) -> Callable[[], tuple]:
    """`queueplan.plan` bound to what the plan is worked out from: what is free and the quota
    room, read now, and what the active jobs hold until when, this tick's admissions included.
    Those holdings are read when the plan is worked out, after the tick commits (the
    admissions are active rows by then), unless the tick already read them for a reservation:
    on the embedded ledger that read of every active job would otherwise hold the write lock
    that submits wait for."""
    now = ctx.now.timestamp()
    read = ctx.holdings
    holdings = read + ctx.admitted if read is not None else None
    capacity: dict[int, int | None] = {}
    free: dict[int, int] = {}
    names: dict[int, str] = {}
    for pk, (cluster, cap) in ctx.capacities.items():
        names[pk] = cluster.name
        capacity[pk] = cap.total_gpus if cap.reachable else None
        free[pk] = cap.total_gpus - ctx.held.cluster[pk].gpus
    room = {pk: team.gpu_quota - ctx.held.team[pk].gpus for pk, team in ctx.teams.items()}
    grace_s = ctx.grace_s

    def plan() -> tuple:
        held = holdings if holdings is not None else _active_holdings(now, grace_s)
        return queueplan.plan(waiting, held, capacity, free, room, names, now)

    return plan


def _plan_due(now: float) -> bool:
    made = store_plan.made_at()
    return made is None or not 0 <= now - made < QUEUE_PLAN_EVERY_S


def _keep_plan(plan: Callable[[], tuple], at: float) -> None:
    """Each waiting job's place in the queue and earliest start (jobs.loops.queueplan), kept
    for the API to read (jobs.stores.queueplan)."""
    entries, totals = plan()
    store_plan.write({job_id: entry.packed() for job_id, entry in entries.items()}, totals, at)


def _active_holdings(now: float, grace_s: Callable[[int], int]) -> list[queueplan.Holding]:
    """What active jobs hold, until their time limits run out (None: no limit), or for a
    preempted one, its grace (`grace_s(cluster)`); borrowed GPUs count against their lender."""
    holdings = []
    active = Job.objects.filter(status__in=S.active(), gpus__gt=0).values_list(
        "team_id",
        "cluster_id",
        "gpus",
        "time_limit_s",
        "current_attempt__start_time",
        "current_attempt__submitted_at",
        "current_attempt__preempted_at",
        "current_attempt__borrowed_from",
    )
    for team_id, cluster_id, gpus, limit, started, admitted, preempted, lender in active:
        # Not started yet: counted from its admission, a time that does not move, so a
        # reservation's start does not slide later tick after tick.
        start = started or admitted
        until = (start.timestamp() if start else now) + limit if limit else None
        if preempted is not None:
            killed = preempted.timestamp() + grace_s(cluster_id)
            until = killed if until is None else min(until, killed)
        holdings.append(queueplan.Holding(lender or team_id, cluster_id, gpus, until))
    return holdings


def _reserve(ctx: _Context, job: _Queued) -> None:
    """The first job of a cluster's order that finds no room gets the GPUs reserved it will
    have first, as the plan says (no starvation: smaller jobs then pass it only as backfill)."""
    if job.cluster in ctx.reservations or not job.gpus:
        return
    cluster, capacity = ctx.capacities[job.cluster]
    now = ctx.now.timestamp()
    free = queueplan.Profile(now, capacity.total_gpus - ctx.held.cluster[cluster.pk].gpus)
    for held in ctx.all_holdings():
        if held.cluster == cluster.pk and held.until is not None:
            free.add(max(held.until, now), held.gpus)
    duration = float(job.time_limit_s) if job.time_limit_s else None
    start = free.earliest(job.gpus, duration, now)
    waited = (ctx.now - (job.queued_at or ctx.now)).total_seconds()
    ctx.reservations[cluster.pk] = _Reservation(
        job, start, waited > settings.SF_RESERVE_AGE_S, free
    )


def _reserved_for_another(ctx: _Context, job: _Queued) -> str | None:
    """Why a job that fits now must not start: it would take GPUs reserved for a job ahead of
    it, past the time they are reserved from. None: it may start (backfill)."""
    held = ctx.reservations.get(job.cluster)
    if held is None or not job.gpus:
        return None
    now = ctx.now.timestamp()
    end = now + job.time_limit_s if job.time_limit_s else None
    if end is not None and (held.start is None or end <= held.start):
        return None  # done before the reserved job can start
    if held.start is not None and _room_left(held, job.gpus):
        return None  # the reserved job still has its GPUs at its start
    if end is None and not held.old:
        return None  # a young reservation: jobs without a time limit may still pass it
    cluster = ctx.capacities[job.cluster][0].name
    when = f"from {_clock(held.start)} UTC" if held.start is not None else "as they come back"
    ahead = f"a job that waited longer ({held.job.gpus} GPUs)"
    if end is None:
        return NoRoom(
            f"waiting for reserved GPUs: cluster {cluster}'s GPUs are reserved {when} for "
            f"{ahead}, and a job without a time limit may not pass a job that has waited more "
            f"than {settings.SF_RESERVE_AGE_S // 60} min"
        )
    return NoRoom(
        f"waiting for reserved GPUs: cluster {cluster}'s GPUs are reserved {when} for {ahead}; "
        "this job's time limit would run past that"
    )


def _room_left(held: _Reservation, gpus: int) -> bool:
    """The reserved job would still find its GPUs at its start with `gpus` more taken for
    good from now."""
    if held.start is None:
        return False
    free = held.free
    k = bisect.bisect_right(free.times, held.start) - 1
    return min(free.free[k:]) - gpus >= held.job.gpus


def _took(ctx: _Context, job: _Queued) -> None:
    """An admission of this tick: it holds its GPUs until its time limit runs out."""
    if not job.gpus:
        return
    now = ctx.now.timestamp()
    until = now + job.time_limit_s if job.time_limit_s else None
    ctx.admitted.append(queueplan.Holding(job.team, job.cluster, job.gpus, until))
    held = ctx.reservations.get(job.cluster)
    if held is not None:
        held.free.add(now, -job.gpus, until)


def _clock(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M")


# An admission to write: job, GPUs, the lending team (None: its own quota), its event's data.
_Admission = tuple[int, int, int | None, dict]


def _admission_record(ctx: _Context, job: _Queued, lender: int | None = None) -> dict:
    """What the team held with this job and the quotas it was admitted under, kept in the
    admission event so `check_ledger` can verify every admission after the fact; for a job on
    borrowed GPUs, the borrowed sum and the cap. Only the job's own team's figures: every
    member of it reads the event, so the lender (which the attempt keeps) and its holdings and
    quota stay out (docs/ARCHITECTURE.md, invariant 8)."""
    team = ctx.teams[job.team]
    held, member = ctx.held.team[team.pk], ctx.held.member[(team.pk, job.user)]
    borrowed = {}
    if lender is not None:
        borrowed = {
            "borrowed": True,
            "borrowed_gpus": ctx.held.borrowed[team.pk],
            "borrow_cap": team.borrow_cap,
        }
    return {
        **borrowed,
        "team_gpus": held.gpus,
        "team_jobs": held.jobs,
        "member_gpus": member.gpus,
        "gpu_quota": team.gpu_quota,
        "max_jobs": team.max_jobs,
        "user_gpu_cap": team.user_gpu_cap,
    }


def _fair_share_order(ctx: _Context, team_ids: list[int]) -> list[tuple[float, int]]:
    """A heap of (score, team): recent GPU-hours plus GPUs held now, per GPU of quota."""
    if len(team_ids) < 2:
        return [(0.0, t) for t in team_ids]
    recent = team_gpu_us(ctx.now.date() - dt.timedelta(days=FAIR_SHARE_DAYS), ctx.now)
    heap = [
        (
            (recent.get(t, 0) / US_PER_HOUR + ctx.held.team[t].gpus)
            / max(ctx.teams[t].gpu_quota, 1),
            t,
        )
        for t in team_ids
    ]
    heapq.heapify(heap)
    return heap


def _gate(ctx: _Context, job: _Queued) -> tuple[str | None, list[str] | None]:
    """Why this job cannot be admitted now (None: it can), and the nodes its ranks would take
    where the cluster reports its nodes."""
    reason = _array_gate(ctx, job) or _quota_gate(ctx, job)
    if reason is not None:
        return reason, None
    reason = _cluster_gate(ctx, ctx.teams[job.team], job)
    if reason is not None:
        return reason, None
    return _node_gate(ctx, job)


def _array_gate(ctx: _Context, job: _Queued) -> str | None:
    """A task of an array already running its --max-parallel tasks waits. The words do not
    count them, so the reason stays the same (and unwritten) tick after tick."""
    if job.array is None or job.array_cap is None:
        return None
    if ctx.active_tasks(job.array) < job.array_cap:
        return None
    return (
        f"waiting for its array: at most {job.array_cap} of array {job.array}'s tasks run at "
        "once (--max-parallel)"
    )


def _array_active() -> dict[int, int]:
    """Tasks of capped arrays that hold their place (SUBMITTED, PENDING, RUNNING), per array,
    in one grouped query."""
    rows = (
        Job.objects.filter(status__in=S.active(), array__max_parallel__isnull=False)
        .values("array_id")
        .annotate(n=Count("id"))
    )
    return {row["array_id"]: row["n"] for row in rows}


def _quota_gate(ctx: _Context, job: _Queued) -> str | None:
    """Why the window, the budget or a quota holds this job back, in words and numbers a user
    understands."""
    team = ctx.teams[job.team]
    closed = _closed_window(ctx, job.window or team.window_id, ctx.cluster_windows.get(job.cluster))
    if closed is not None:
        return closed.describe_wait(ctx.now)
    if team.max_gpus_per_job is not None and job.gpus > team.max_gpus_per_job:
        return (
            f"waiting for quota: team {team.name} allows at most {team.max_gpus_per_job} "
            f"GPUs per job; this job needs {job.gpus}"
        )
    if job.gpus and team.gpu_hours_per_month is not None:
        used = ctx.month_us.get(team.pk, 0)
        if used >= _budget_us(team):
            return f"waiting for budget: {_budget_words(team, used, ctx.now)}"
    held = ctx.held.team[team.pk]
    if team.max_jobs is not None and held.jobs >= team.max_jobs:
        return (
            f"waiting for a slot: team {team.name} runs {held.jobs} of the "
            f"{team.max_jobs} jobs it may run at once"
        )
    if held.gpus + job.gpus > team.gpu_quota:
        lender = lending.lender(ctx.lending, ctx.held, team, job.gpus)
        if lender is None:
            taking = lending.take_back(ctx.lending, ctx.held, team, job.id, job.user, job.gpus)
            if taking is not None:
                return Planned(taking)
            return Planned(
                f"waiting for quota: team {team.name} uses {held.gpus} of "
                f"{team.gpu_quota} GPUs; this job needs {job.gpus}"
                + lending.borrow_words(ctx.held, team, job.gpus)
            )
        ctx.lending.borrowing[job.id] = lender.pk
    member = ctx.held.member[(team.pk, job.user)]
    if team.user_gpu_cap is not None and member.gpus + job.gpus > team.user_gpu_cap:
        return (
            f"waiting for quota: {job.username} uses {member.gpus} of the "
            f"{team.user_gpu_cap} GPUs team {team.name} allows one member; "
            f"this job needs {job.gpus}"
        )
    for cap in ctx.caps_matching(team.pk, job.gpu_type):
        used, limit = ctx.type_use(team.pk, cap), ctx.type_caps[team.pk][cap]
        if used + job.gpus > limit:
            return (
                f"waiting for quota: team {team.name} uses {used} of its {limit} {cap} GPUs; "
                f"this job needs {job.gpus}"
            )
    return None


def _queue_again(ids: list[int], reason: str) -> list[int]:
    """Jobs the scheduler paused for a closed window back to QUEUED, their mark cleared; those
    that moved on meanwhile (a person's stop) are left as they are."""
    if not ids:
        return []
    changed, _ = apply_transitions(
        S.QUEUED, [Change(pk, reason) for pk in ids], actor="scheduler", expected={S.PAUSED}
    )
    queued = [job.pk for job in changed]
    Job.objects.filter(pk__in=queued).update(paused_by_window=False)
    return queued


def _cluster_gate(ctx: _Context, team: Team, job: _Queued) -> str | None:
    cap = ctx.capacities.get(job.cluster)
    if cap is None:
        return "waiting for capacity: the job's cluster is disabled"
    cluster, capacity = cap
    if not capacity.reachable:
        return f"waiting for cluster {cluster.name}: it cannot be reached ({capacity.message})"
    used = ctx.held.cluster[cluster.pk]
    free = capacity.total_gpus - used.gpus
    kind = "virtual GPU slots" if capacity.virtual else "GPUs"
    if job.gpus > free:
        why = f" ({capacity.message})" if capacity.message else ""  # e.g. every node drained
        return NoRoom(
            f"waiting for capacity: cluster {cluster.name} has {max(free, 0)} of "
            f"{capacity.total_gpus} {kind} free{why}; this job needs {job.gpus}"
        )
    if capacity.max_jobs is not None and used.jobs >= capacity.max_jobs:
        return (
            f"waiting for capacity: cluster {cluster.name} runs {used.jobs} of "
            f"{capacity.max_jobs} jobs it allows at once"
        )
    percent = ctx.shares.get((team.pk, cluster.pk))
    if percent is not None and job.gpus:
        limit = capacity.total_gpus * percent // 100
        mine = ctx.held.team_cluster[(team.pk, cluster.pk)].gpus
        if mine + job.gpus > limit:
            return (
                f"waiting for share: team {team.name} holds {mine} of its {limit} {kind} "
                f"on cluster {cluster.name} ({percent}% of {capacity.total_gpus}); "
                f"this job needs {job.gpus}"
            )
    return None


def _node_gate(ctx: _Context, job: _Queued) -> tuple[str | None, list[str] | None]:
    """Gang admission: every rank of the job on a node with room for it, all at once; never
    a cluster sum (2 x 4 GPUs does not start on 3 + 3 + 2 free)."""
    cluster, capacity = ctx.capacities[job.cluster]
    if not capacity.nodes:
        return None, None  # one pool: the sum was the whole check
    nodes = ctx.nodes_of(cluster, capacity)
    g, kind = job.gpus_per_node, job.gpu_type
    avoid = _full_types(ctx, job) if not kind else frozenset()
    placed = nodes.place(job.nodes, g, kind, avoid)
    if placed is not None:
        return None, placed
    have = nodes.room(job.nodes, g, kind, avoid)
    what = f"{g} free {kind + ' ' if kind else ''}GPU{'s' if g != 1 else ''}"
    if nodes.share:
        return NoRoom(
            f"waiting for capacity: {job.nodes} rank{'s' if job.nodes != 1 else ''} with {what} "
            f"each on cluster {cluster.name}: room for {have} now"
        ), None
    return NoRoom(
        f"waiting for {job.nodes} node{'s' if job.nodes != 1 else ''} with {what}"
        f"{' each' if job.nodes != 1 else ''}: {have} such node{'s' if have != 1 else ''} free "
        f"on cluster {cluster.name}"
    ), None


def _hold(ctx: _Context, job: _Queued, placed: list[str] | None) -> None:
    """What an admission takes for the rest of the tick: its ranks' room on their nodes, and
    its GPUs of a capped type (the type it asked for, else the types of its nodes)."""
    if placed is not None:
        nodes = ctx.nodes[job.cluster]
        nodes.take(placed, job.gpus_per_node)
    if job.team not in ctx.type_caps:
        return
    if job.gpu_type:
        ctx.count_type_use(job.team, job.gpu_type, job.gpus)
    elif placed is not None:
        for name in placed:
            ctx.count_type_use(job.team, nodes.types[name], job.gpus_per_node)


def _full_types(ctx: _Context, job: _Queued) -> frozenset[str]:
    """The capped types a job that asks for no type must keep off: those without room for it."""
    caps = ctx.type_caps.get(job.team, {})
    return frozenset(c for c, limit in caps.items() if ctx.type_use(job.team, c) + job.gpus > limit)


def _type_caps() -> dict[int, dict[str, int]]:
    caps: dict[int, dict[str, int]] = defaultdict(dict)
    for team, kind, gpus in TeamGpuTypeQuota.objects.values_list("team_id", "gpu_type", "gpus"):
        caps[team][kind] = gpus
    return dict(caps)


def _type_use(ctx: _Context) -> dict[tuple[int, str], int]:
    """GPUs of each capped type the teams with caps hold now: a job asking for a type counts
    toward it; one asking for none, toward the types of the nodes its ranks hold (clusters
    that report their nodes; on a pool cluster such a job counts toward no type)."""
    used: dict[tuple[int, str], int] = defaultdict(int)
    active = Job.objects.filter(
        team_id__in=list(ctx.type_caps), status__in=S.active(), gpus__gt=0
    ).values_list("pk", "team_id", "cluster_id", "gpus", "nodes", "gpu_type")
    for pk, team, cluster_id, gpus, count, kind in active:
        if kind:
            for cap in ctx.caps_matching(team, kind):
                used[(team, cap)] += gpus
            continue
        cap_of = ctx.capacities.get(cluster_id)
        if cap_of is None or not cap_of[1].nodes:
            continue
        nodes = ctx.nodes_of(*cap_of)
        for name in nodes.where.get(pk, []):
            for cap in ctx.caps_matching(team, nodes.types[name]):
                used[(team, cap)] += gpus // max(count, 1)
    return dict(used)


def _held_nodes(cluster: Cluster, capacity: Capacity) -> _Nodes:
    """The cluster's nodes less what its active jobs hold: on the nodes the engine reported for
    their ranks where it did, else where the scheduler would place them now."""
    nodes = _Nodes(capacity)
    active = (
        Job.objects.filter(cluster=cluster, status__in=S.active(), gpus__gt=0)
        .order_by("pk")
        .values_list("pk", "gpus", "nodes", "gpu_type", "current_attempt__ranks")
    )
    for pk, gpus, count, kind, ranks in active:
        per_node = gpus // max(count, 1)
        seen = [r["node"] for r in ranks or [] if isinstance(r, dict) and "node" in r]
        placed = (
            seen
            if len(seen) == count and all(name in nodes.free for name in seen)
            else nodes.place(count, per_node, kind)
        )
        if placed is not None:
            nodes.take(placed, per_node)
            nodes.where[pk] = placed
    return nodes


def _closed_window(ctx: _Context, *window_ids: int | None) -> Window | None:
    for window_id in window_ids:
        window = ctx.windows.get(window_id) if window_id else None
        if window is not None and not window.is_open(ctx.now):
            return window
    return None


def _budget_us(team: Team) -> int:
    return int(Decimal(team.gpu_hours_per_month or 0) * US_PER_HOUR)


def _budget_words(team: Team, used_us: int, now: dt.datetime) -> str:
    renews = (now.astimezone(dt.UTC).replace(day=1) + dt.timedelta(days=32)).replace(day=1)
    return (
        f"team {team.name} used {used_us / US_PER_HOUR:.1f} of its "
        f"{team.gpu_hours_per_month} GPU-hours this month; the budget renews "
        f"{renews:%b} 1 00:00 UTC"
    )


def _month_usage(teams: dict[int, Team], now: dt.datetime) -> dict[int, int]:
    if not any(t.gpu_hours_per_month is not None for t in teams.values()):
        return {}
    return team_gpu_us(now.astimezone(dt.UTC).date().replace(day=1), now)


def _hard_stops(teams: dict[int, Team], month_us: dict[int, int], now: dt.datetime) -> list[int]:
    """Stop the active GPU jobs of teams whose budget is used up and that asked for a hard stop."""
    over = [
        t
        for t in teams.values()
        if t.budget_hard_stop
        and t.gpu_hours_per_month is not None
        and month_us.get(t.pk, 0) >= _budget_us(t)
    ]
    stopped = []
    for team in over:
        ids = list(
            Job.objects.filter(team=team, status__in=S.active(), gpus__gt=0).values_list(
                "pk", flat=True
            )
        )
        reason = (
            f"stopped: team {team.name} used its monthly budget of "
            f"{team.gpu_hours_per_month} GPU-hours (hard stop)"
        )
        stopped += halt(
            ids, S.STOPPED, reason, actor="scheduler", now=now, expected=S.active()
        ).halted
    return stopped


def _apply_window_policy(
    now: dt.datetime, teams: dict[int, Team], windows: dict[int, Window]
) -> tuple[list[int], list[int]]:
    """Pause `--window-policy pause` jobs whose window closed; queue them again when it opens."""
    jobs = Job.objects.filter(window_policy=Job.WindowPolicy.PAUSE).filter(
        status__in=S.active() | {S.PAUSED}
    )
    to_pause: dict[str, list[int]] = defaultdict(list)
    to_resume: list[int] = []
    rows = jobs.values_list("pk", "status", "paused_by_window", "team_id", "window_id",
                            "cluster__window_id")  # fmt: skip
    for pk, status, by_window, team_id, window_id, cluster_window in rows:
        ids = (window_id or teams[team_id].window_id, cluster_window)
        closed = next(
            (windows[w] for w in ids if w in windows and not windows[w].is_open(now)), None
        )
        if closed is not None and status in S.active():
            opens = closed.next_opening(now)
            to_pause[
                f"paused: window {closed.name} closed; the job resumes when it opens "
                f"({opens:%a %H:%M} {opens.tzname()})"
            ].append(pk)
        elif closed is None and status == S.PAUSED and by_window:
            to_resume.append(pk)
    paused = [
        pk
        for reason, ids in to_pause.items()
        for pk in halt(
            ids, S.PAUSED, reason, actor="scheduler", now=now, expected=S.active(), by_window=True
        ).halted
    ]
    reason = "window opened: resumed; waiting for the scheduler"
    return paused, _queue_again(to_resume, reason)


def _submit(admit: list[_Admission], now: dt.datetime) -> list[int]:
    if not admit:
        return []
    gpus_by_job = {job_id: gpus for job_id, gpus, _, _ in admit}
    lender_by_job = {job_id: lender for job_id, _, lender, _ in admit}
    changes = [
        Change(
            job_id,
            "admitted on GPUs borrowed from another team's idle quota (preemptible); launching"
            if lender is not None
            else "admitted; launching",
            data=data,
        )
        for job_id, _, lender, data in admit
    ]
    changed, _ = apply_transitions(S.SUBMITTED, changes, actor="scheduler", expected={S.QUEUED})
    fields = ("id", "run_id", "attempt_count", "nodes")
    jobs = list(Job.objects.filter(pk__in=[j.pk for j in changed]).only(*fields))
    attempts = [
        Attempt(
            job_id=job.pk,
            number=job.attempt_count + 1,
            gpus=gpus_by_job[job.pk],
            nodes=job.nodes,
            backend_name=backend_name(job.run_id, job.attempt_count + 1),
            borrowed_from_id=lender_by_job[job.pk],
        )
        for job in jobs
    ]
    clocks.open_attempts(attempts, now)
    newest = Attempt.objects.filter(job_id=OuterRef("pk")).order_by("-number").values("pk")[:1]
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(
        attempt_count=F("attempt_count") + 1, current_attempt=Subquery(newest)
    )
    return [a.pk for a in attempts]


def _windows() -> dict[int, Window]:
    parsed = {}
    for w in ScheduleWindow.objects.all():
        try:
            parsed[w.pk] = parse_window(w.spec, w.timezone, w.name)
        except WindowSpecError:
            log.warning("schedule window %s has an invalid spec; ignoring it", w.name)
    return parsed


def _cluster_capacities() -> dict[int, tuple[Cluster, Capacity]]:
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


def _take_advisory_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])
        return bool(cursor.fetchone()[0])
