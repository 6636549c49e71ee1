"""The scheduler tick: its steps in order, one tick at a time, and what it decided written.

A tick (`admit_queued_jobs`) runs these steps, each a function of its own that returns what it
did (`TickResult` gathers it):
1. `jobs.ledger.lifecycle.requeue_due_retries`: cooled-down FAILED jobs join this tick's queue;
2. `metering.records.meter_ended`: ended attempts metered, so the budgets and fair share read
   current usage;
3. `jobs.loops.snapshot.cluster_capacities`: every enabled cluster's engine asked what it has,
   outside any transaction;
then, in the tick's turn, the rules read (`jobs.loops.snapshot.read_rules`) and, in one writing
step:
4. `jobs.loops.budgets.apply_budget_stops`: a team whose monthly budget (GPU-hours or money)
   is used up with `budget_hard_stop` set has its running GPU jobs stopped; then
   `notify_budget_alerts`: each money-budget threshold a team reached told once a month;
5. `jobs.loops.windows.apply_window_policy`: jobs submitted with `--window-policy pause` are
   paused when their window closes and queued again when it reopens;
6. `jobs.ledger.preemption.requeue`: the jobs a preemption paused are queued again;
7. `jobs.ledger.departures.stop_outsiders`, `jobs.ledger.ungranted.stop_ungranted`: the QUEUED
   jobs whose submitter may no longer submit in the job's team, or whose team may no longer use
   their cluster, stopped (last: the steps above may have queued theirs);
8. admission: the snapshot read (`jobs.loops.snapshot`), the queue offered in fair-share order
   through the gates (`jobs.loops.admission`), and what it decided written here: waiting
   reasons, admissions (their attempts opened) in batches (`jobs.ledger.batches`), lending's
   notices (`jobs.ledger.preemption`), and the queue plan kept.

One tick reads the whole queue in one query and the active jobs in another, keeps running sums
in memory, and writes admissions and waiting reasons in batches, so its query count does not
grow with the queue. Ticks take turns (a PostgreSQL advisory lock held for the tick's
transaction; a lock file beside the embedded ledger, whose tick reads and decides outside the
database's write lock and then writes), so two schedulers at once never over-admit: the second
one finds the turn taken and skips the rest of its tick.

A tick also plans the whole queue it considered (`jobs.loops.queueplan`): where every waiting
job stands and when it can start; at most once per QUEUE_PLAN_EVERY_S, as working the plan out
costs as much as the rest of a tick over a long backlog, and under a stream of submits kicked
ticks come every second or so.
"""

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.models import F, OuterRef, Subquery
from django.utils import timezone
from sf.contract import backend_name

from jobs.ledger import clocks, preemption
from jobs.ledger.batches import write_batches
from jobs.ledger.departures import stop_outsiders
from jobs.ledger.lifecycle import requeue_due_retries
from jobs.ledger.transitions import Change, apply_transitions
from jobs.ledger.ungranted import stop_ungranted
from jobs.loops import queueplan
from jobs.loops.admission import Admission, Decided, decide
from jobs.loops.budgets import apply_budget_stops, notify_budget_alerts
from jobs.loops.reservations import active_holdings
from jobs.loops.snapshot import Rules, cluster_capacities, read_rules, read_snapshot
from jobs.loops.windows import apply_window_policy
from jobs.models import Attempt, Job
from jobs.states import JobStatus
from jobs.stores import queueplan as store_plan
from metering.records import meter_ended
from starforge.db.sqlite3.base import turn as sqlite_turn

S = JobStatus
ADVISORY_LOCK_KEY = 0x5F5C_4ED0  # any constant unique to Starforge's scheduler
# Bounds one tick's transaction; the next tick (kicked right away by the task) goes on.
MAX_ADMIT_PER_TICK = 5000
# A tick plans the queue when the kept plan is at least this old (or missing): beat's ticks
# come every 2 s, so places are at most one beat's interval and a tick behind the ledger. A job
# queued since the plan reads as not placed yet (`jobs.reads.queue`).
QUEUE_PLAN_EVERY_S = 1.5

# What one writing step of a tick runs in (`_turn`).
Writing = Callable[[], contextlib.AbstractContextManager]


@dataclass
class TickResult:
    """What a tick did, step by step (job ids, but where said otherwise)."""

    skipped: bool = False  # another tick had the turn: nothing from step 4 on ran
    retried: list[int] = field(default_factory=list)  # queued again after their cooldown
    metered: int = 0  # ended attempts added to the usage records
    stopped: list[int] = field(default_factory=list)  # stopped by a budget hard stop
    alerts: list[tuple[int, int]] = field(default_factory=list)  # (team, percent) told
    paused: list[int] = field(default_factory=list)  # paused because their window closed
    resumed: list[int] = field(default_factory=list)  # queued again as their window opened
    requeued: list[int] = field(default_factory=list)  # queued again after a preemption
    outsiders: list[int] = field(default_factory=list)  # stopped: submitter may not submit now
    ungranted: list[int] = field(default_factory=list)  # stopped: team's cluster grant revoked
    admitted: list[int] = field(default_factory=list)  # attempt ids to launch
    waiting: int = 0  # jobs whose waiting reason changed
    preempted: list[int] = field(default_factory=list)  # told to give borrowed GPUs back


def admit_queued_jobs(now: dt.datetime | None = None) -> TickResult:
    """One scheduler tick. Safe to run concurrently and repeatedly: one tick at a time has the
    turn (`_turn`); a tick that finds it taken skips the steps that need it."""
    now = now or timezone.now()
    result = TickResult()
    result.retried = requeue_due_retries(now)
    result.metered = meter_ended()
    capacities = cluster_capacities()
    with _turn() as writing:
        if writing is None:
            result.skipped = True
            return result
        rules = read_rules(now)
        with writing():
            _apply_rules(now, rules, result)
        decided = decide(read_snapshot(now, rules, capacities), MAX_ADMIT_PER_TICK)
        _record(decided, writing, result)
    return result


def _apply_rules(now: dt.datetime, rules: Rules, result: TickResult) -> None:
    """Steps 4 to 7, before admission reads the queue."""
    result.stopped = apply_budget_stops(now, rules.teams, rules.month_us, rules.month_cost)
    result.alerts = notify_budget_alerts(now, rules.teams, rules.month_cost)
    result.paused, result.resumed = apply_window_policy(now, rules.teams, rules.windows)
    result.requeued = preemption.requeue()
    result.outsiders = stop_outsiders(now)  # last: the steps above may have queued theirs
    result.ungranted = stop_ungranted(now)  # after them too, for the same reason


@contextlib.contextmanager
def _turn() -> Iterator[Writing | None]:
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


def _take_advisory_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])
        return bool(cursor.fetchone()[0])


def _record(decided: Decided, writing: Writing, result: TickResult) -> None:
    """Write what the tick decided: waiting reasons, admissions, preemption notices, each step
    in `writing()`, and the admissions in batches (`jobs.ledger.batches`); then keep the plan."""
    snap, tally = decided.snap, decided.tally
    if decided.reasons:
        with writing():
            for reason, ids in decided.reasons.items():
                # A waiting reason is not a status change: no event, and only QUEUED rows are
                # touched.
                Job.objects.filter(pk__in=ids, status=S.QUEUED).update(status_reason=reason)
    result.waiting = sum(len(ids) for ids in decided.reasons.values())
    for batch in write_batches(decided.admit):
        with writing():
            result.admitted += _submit(batch, snap.now)
    if tally.lending.notices:
        clusters = {pk: cluster for pk, (cluster, _) in snap.capacities.items()}
        with writing():
            result.preempted = preemption.send_notices(tally.lending.notices, clusters, snap.now)
    if decided.considered_all and _plan_due(snap.now.timestamp()):
        # Worked out and kept once the tick's writes have committed (at once on the embedded
        # ledger, where they have): there their transactions hold the database's write lock,
        # which submits wait for.
        plan = _planner(decided)
        at = snap.now.timestamp()
        transaction.on_commit(lambda: _keep_plan(plan, at), robust=True)


def _submit(admit: list[Admission], now: dt.datetime) -> list[int]:
    """The admitted jobs SUBMITTED, each with its new attempt opened; returns the attempts."""
    if not admit:
        return []
    total_gpus_by_job = {job_id: total_gpus for job_id, total_gpus, _, _ in admit}
    lender_by_job = {job_id: lender for job_id, _, lender, _ in admit}
    changes = [
        Change(job_id, _admitted(lender, data), data=data) for job_id, _, lender, data in admit
    ]
    changed, _ = apply_transitions(S.SUBMITTED, changes, actor="scheduler", expected={S.QUEUED})
    fields = ("id", "run_id", "attempt_count", "nodes")
    jobs = list(Job.objects.filter(pk__in=[j.pk for j in changed]).only(*fields))
    attempts = [
        Attempt(
            job_id=job.pk,
            number=job.attempt_count + 1,
            total_gpus=total_gpus_by_job[job.pk],
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


def _admitted(lender: int | None, data: dict) -> str:
    """An admission's reason: on whose GPUs, and the nodes kept off where an attempt of the
    job hung (`jobs.loops.admission.node_avoidance`)."""
    reason = (
        "admitted on GPUs borrowed from another team's idle quota (preemptible); launching"
        if lender is not None
        else "admitted; launching"
    )
    if data.get("kept_off"):
        reason += f"; kept off {', '.join(data['kept_off'])}, where an attempt of it hung"
    if data.get("not_kept_off"):
        reason += (
            f"; not kept off {', '.join(data['not_kept_off'])}, where an attempt of it hung: "
            "without it, too few of the cluster's nodes would be left for the job"
        )
    return reason


def _planner(decided: Decided) -> Callable[[], tuple]:
    """`queueplan.plan` bound to what the plan is worked out from: what is free and the quota
    room once this tick's admissions are in, and what the active jobs hold until when, this
    tick's admissions and notices included (as the ledger says once the tick has committed)."""
    snap, tally = decided.snap, decided.tally
    now = snap.now.timestamp()
    capacity: dict[int, int | None] = {}
    free: dict[int, int] = {}
    names: dict[int, str] = {}
    for pk, (cluster, cap) in snap.capacities.items():
        names[pk] = cluster.name
        capacity[pk] = cap.total_gpus if cap.reachable else None
        free[pk] = cap.total_gpus - tally.held.cluster[pk].total_gpus
    room = {pk: team.gpu_quota - tally.held.team[pk].total_gpus for pk, team in snap.teams.items()}
    told, admitted, waiting = tally.lending.notified, tally.backfill.admitted, decided.waiting

    def plan() -> tuple:
        held = active_holdings(snap, told) + admitted
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
