"""The reconciler tick: observe each backend once, compare with the ledger, act on the difference.

Per cluster: one batched `poll` of every open attempt's backend object, each native state mapped
through the executor's explicit `STATE_TABLE`. It sets `start_time` when the process is really
up, closes attempts (exit code, end time) exactly once, fails jobs whose backend object vanished
for longer than the grace period or that sat PENDING past their deadline, repairs attempts left
in SUBMITTED by a crash mid-launch, and re-cancels backend objects of stopped attempts that are
still alive. A native state missing from the table changes nothing but is recorded.

The poll only looks; every change on an engine is one this tick asks for: `cancel` (a pending
deadline, the sweep of closed attempts) and, last, `reap_stale` with the poll's answer, for what
the poll marked as left behind (`jobs.executors.base.Executor`).
"""

import datetime as dt
import logging
from collections import defaultdict
from typing import NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, QuerySet, When
from django.db.models.functions import Coalesce
from django.utils import timezone
from sf.contract import INGEST_FAILED, RANK_STATES, Failure

from jobs.durations import time_limit_reason
from jobs.executors import Executor, Observation, executor_for
from jobs.executors.base import preempt_grace_s
from jobs.ledger import clocks, ends, preemption
from jobs.ledger.batches import write_batches
from jobs.ledger.ends import End
from jobs.ledger.halt import halt
from jobs.ledger.transitions import TransitionRefused, advance, transition, walk
from jobs.loops import lending
from jobs.loops.launcher import launch_attempts
from jobs.models import Attempt, Cluster, JobEvent
from jobs.states import JobStatus
from jobs.stores import logstore

log = logging.getLogger(__name__)
S = JobStatus
ORPHAN_SWEEP = dt.timedelta(minutes=10)
# How stale an attempt's last_seen_at may be; a vanished object is declared lost a grace after
# it (so between SF_LOST_GRACE_S and that plus this after its real last sighting).
SEEN_RESOLUTION = dt.timedelta(seconds=10)
# The backend's diagnosis, put before how the process ended in a failed job's reason.
FAILURE_WORDS: dict[str, str] = {
    Failure.OOM: "out of memory",
    Failure.LOST: "lost on backend",
    Failure.PREEMPTED: "preempted by the backend",
}
_SUCCEEDED_REASON = "exited with code 0"
_PENDING_REASON = "on the cluster, not running yet"
_RUNNING_REASON = "the entrypoint is running"


def reconcile_all(now: dt.datetime | None = None) -> None:
    for cluster in Cluster.objects.filter(enabled=True):
        try:
            reconcile_cluster(cluster, now)
        except PollFailed as exc:  # one unreachable engine must not stop the others
            log.warning("poll of cluster %s failed; nothing changed for it: %s", cluster.name, exc)
            record_poll_health(cluster, str(exc), now or timezone.now())
        except Exception:
            log.exception("reconcile of cluster %s failed; nothing changed for it", cluster.name)


class PollFailed(Exception):
    """The backend could not be asked: no job on that cluster changes this tick."""


def record_poll_health(cluster: Cluster, error: str, now: dt.datetime) -> None:
    """Write the cluster's poll health when it changes (Diagnostics reads it)."""
    if error:
        changed = Cluster.objects.filter(pk=cluster.pk).exclude(poll_error=error)
        changed.filter(poll_failing_since__isnull=True).update(poll_failing_since=now)
        changed.update(poll_error=error)
    elif cluster.poll_failing_since or cluster.poll_error:
        Cluster.objects.filter(pk=cluster.pk).update(poll_failing_since=None, poll_error="")


class OpenRow(NamedTuple):
    """What a tick needs to know of an open attempt to tell whether the poll changed anything:
    read as one row, not as two models (a thousand PENDING jobs are read every tick)."""

    pk: int
    job_id: int
    job_ref: str
    backend_name: str
    native_state: str
    native_message: str
    status: str
    pending_since: dt.datetime
    pending_deadline_s: int | None
    time_limit_s: int | None
    start_time: dt.datetime | None
    sighting_due: bool  # last_seen_at is older than SEEN_RESOLUTION, or unset
    preempted_at: dt.datetime | None


OPEN_COLUMNS = (
    "pk",
    "job_id",
    "job_ref",
    "backend_name",
    "native_state",
    "native_message",
    "job__status",
    "pending_since",
    "job__pending_deadline_s",
    "job__time_limit_s",
    "start_time",
    "sighting_due",
    "preempted_at",
)


def reconcile_cluster(cluster: Cluster, now: dt.datetime | None = None) -> None:
    now = now or timezone.now()
    executor = executor_for(cluster)
    open_attempts = _open(Attempt.objects.filter(job__cluster=cluster))
    stale = Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=now - SEEN_RESOLUTION)
    rows = [
        OpenRow(*values)
        for values in open_attempts.annotate(
            pending_since=Coalesce("pending_at", "submitted_at"),
            sighting_due=Case(When(stale, then=True), default=False),
        ).values_list(*OPEN_COLUMNS)
    ]
    closed = list(
        Attempt.objects.filter(job__cluster=cluster, end_time__gte=now - ORPHAN_SWEEP)
        .exclude(job_ref="")
        .exclude(job__status__in=S.active(), job__current_attempt=F("pk"))
    )
    refs = [a.job_ref for a in rows + closed if a.job_ref]
    try:
        observations = executor.poll(refs) if refs else {}
    except Exception as exc:
        raise PollFailed(f"{type(exc).__name__}: {exc}") from exc
    record_poll_health(cluster, "", now)
    mine = _observed(rows + closed, observations)
    # The sighting is noted at most once per SEEN_RESOLUTION (_maybe_lost allows for it): a
    # thousand waiting jobs are not a thousand row writes every tick.
    seen = [a.pk for a in rows if a.sighting_due and a.pk in mine]
    Attempt.objects.filter(pk__in=seen).update(last_seen_at=now)
    running = [a.pk for a in rows if _maps_to(executor, mine.get(a.pk)) == S.RUNNING]
    clocks.seen_alive(running, now)
    # Only an attempt whose poll says something new is read whole and acted on (or a preempted
    # one past its grace: it is cancelled each tick until it ends).
    grace = preempt_grace_s(cluster.settings)
    changed = [
        a.pk
        for a in rows
        if lending.past_grace(a.preempted_at, grace, now)
        or not _steady(executor, a, mine.get(a.pk), now)
    ]
    attempts = list(_open(Attempt.objects.filter(pk__in=changed)).select_related("job"))
    _record_native(executor, attempts, mine)
    _record_ranks(executor, attempts, mine)
    for attempt in _in_groups(executor, attempts, mine, now):
        try:
            _reconcile_attempt(executor, attempt, mine.get(attempt.pk), now, grace)
        except TransitionRefused as exc:  # the job moved on (a user stop) since we read it
            log.info("reconcile of %s skipped: %s", attempt.backend_name, exc)
        except Exception:
            log.exception("reconcile of %s failed; skipped this tick", attempt.backend_name)
    for attempt in closed:
        _sweep_orphan(executor, attempt, mine.get(attempt.pk), now)
    # What the poll marked as left behind (Slurm: a job still RUNNING a grace after its runner's
    # signed exit; local: the processes of a job whose runner died) is ended now, after the
    # ledger has taken the poll's answer: a poll only looks. Only objects carrying their own
    # attempt's name are handed on (see _observed).
    executor.reap_stale({a.job_ref: mine[a.pk] for a in rows if a.pk in mine})


def _open(attempts: QuerySet[Attempt]) -> QuerySet[Attempt]:
    """The current, unclosed attempts of active jobs among `attempts`."""
    return attempts.filter(
        job__status__in=S.active(), job__current_attempt=F("pk"), end_time__isnull=True
    )


def _steady(executor: Executor, row: OpenRow, obs: Observation | None, now: dt.datetime) -> bool:
    """True when this tick has nothing to do for the attempt but note the sighting: the poll
    says what the ledger already holds, and no deadline has passed. What _reconcile_attempt,
    _record_native and _record_ranks would do nothing with."""
    if obs is None or not row.job_ref or obs.native_state != row.native_state:
        return False
    if row.status == S.RUNNING and past_time_limit(row.time_limit_s, row.start_time, now):
        return False
    if "ranks" in obs.details:  # a multi-node attempt's ranks are compared with the models
        return False
    target = executor.STATE_TABLE.get(obs.native_state)
    if target is None:  # unmapped, and recorded when it first appeared
        return True
    if target == S.RUNNING:
        return row.status == S.RUNNING
    if target != S.PENDING or obs.message != row.native_message:
        return False
    if row.status == S.RUNNING:
        return True  # no step back to PENDING, no deadline
    deadline = row.pending_deadline_s or settings.SF_PENDING_DEADLINE_S
    return row.status == S.PENDING and (now - row.pending_since).total_seconds() <= deadline


def _maps_to(executor: Executor, obs: Observation | None) -> JobStatus | None:
    return executor.STATE_TABLE.get(obs.native_state) if obs is not None else None


def _observed(attempts: list, observations: dict[str, Observation]) -> dict:
    """{attempt pk: its observation}, leaving out an object that carries another attempt's
    name: after a controller crash Slurm hands out job ids again, and one attempt's end (or a
    sweep's cancel) must not land on the attempt that got its id. Unseen, it is lost later."""
    found = {}
    for attempt in attempts:
        obs = observations.get(attempt.job_ref) if attempt.job_ref else None
        if obs is not None and obs.name in ("", attempt.backend_name):
            found[attempt.pk] = obs
    return found


# What a group's clocks calls change on its attempts in memory, read again after a rollback.
_CLOCK_FIELDS = [
    "start_time",
    "end_time",
    "alive_at",
    "submitted_at",
    "exit_code",
    "end_reason",
    "failure",
]


def _in_groups(
    executor: Executor, attempts: list[Attempt], mine: dict[int, Observation], now: dt.datetime
) -> list[Attempt]:
    """Apply the poll's common news in groups; return the attempts left to `_reconcile_attempt`.

    The common news: a SUBMITTED job is PENDING on its engine, a SUBMITTED or PENDING one is
    RUNNING, or any of them SUCCEEDED (its start known; not preempted; no note on how the end
    was learnt). Each group is one transaction: its clocks in a few statements
    (`clocks.mark_started_many`, `ends.end_group`) and one transition per step of the path,
    where `_reconcile_attempt` takes a transaction, its clocks and a transition per job and
    step, some 14 statements a job. When 200 short Slurm jobs ended together, a tick took up to
    6 s on a loaded 2-core host (each statement waited ~5-10 ms for PostgreSQL's share of the
    CPU), and each end reached the ledger as late as its turn in the loop
    (`bench/slurm_bench.py`).

    A group is written as `_reconcile_attempt` would write each of its attempts, or not at all:
    when a job moved on since the tick read it (a stop, a pause: a transition refused, an
    attempt already closed) or anything else fails, the group is rolled back and each of its
    attempts takes the per-attempt path, which decides for it as it always has.
    """
    cases: dict[JobStatus, list[Attempt]] = defaultdict(list)
    rest: list[Attempt] = []
    for attempt in attempts:
        case = _common_case(executor, attempt, mine.get(attempt.pk))
        (cases[case] if case else rest).append(attempt)
    groups = [(case, group) for case, all_ in cases.items() for group in write_batches(all_)]
    for case, group in groups:
        try:
            with transaction.atomic():
                _GROUP_WRITERS[case](group, mine, now)
        except Exception as exc:  # noqa: BLE001 - the per-attempt path decides for each
            for attempt in group:
                attempt.refresh_from_db(fields=_CLOCK_FIELDS)
            log.info("%d attempt(s) going %s reconciled one by one: %s", len(group), case, exc)
            rest += group
            continue
        if case != S.PENDING:
            continue
        for attempt in group:  # as `_reconcile_attempt` does after the step
            if _past_pending_deadline(attempt, now):
                attempt.job.refresh_from_db(fields=["status"])
                try:
                    _check_pending_deadline(executor, attempt, now)
                except TransitionRefused as exc:
                    log.info("reconcile of %s skipped: %s", attempt.backend_name, exc)
                except Exception:
                    log.exception("reconcile of %s failed; skipped this tick", attempt.backend_name)
    return rest


def _common_case(executor: Executor, attempt: Attempt, obs: Observation | None) -> S | None:
    """The group an attempt's news belongs to (see `_in_groups`), or None."""
    if obs is None or not attempt.job_ref or attempt.preempted_at is not None:
        return None
    target, status = executor.STATE_TABLE.get(obs.native_state), attempt.job.status
    if target == S.PENDING and status == S.SUBMITTED:
        return S.PENDING
    if target == S.RUNNING and status in (S.SUBMITTED, S.PENDING):
        return S.RUNNING
    known_start = obs.start_time is not None or attempt.start_time is not None
    if target == S.SUCCEEDED and known_start and not obs.details.get("note"):
        return S.SUCCEEDED if status in (S.SUBMITTED, S.PENDING, S.RUNNING) else None
    return None


def _group_pending(group: list[Attempt], mine: dict[int, Observation], now: dt.datetime) -> None:
    walk(group, [S.PENDING], _PENDING_REASON, actor="reconciler")


def _group_running(group: list[Attempt], mine: dict[int, Observation], now: dt.datetime) -> None:
    """`_mark_running` for each."""
    clocks.mark_started_many(group, {a.pk: mine[a.pk].start_time or now for a in group}, now)
    walk(group, [S.PENDING, S.RUNNING], _RUNNING_REASON, actor="reconciler")


def _group_succeeded(group: list[Attempt], mine: dict[int, Observation], now: dt.datetime) -> None:
    """`_finish` for each, the start known: the same end, in a few statements for them all."""
    observed = {a.pk: _observed_end(a, S.SUCCEEDED, mine[a.pk], now) for a in group}
    ends.end_group(group, observed, now)


_GROUP_WRITERS = {
    S.PENDING: _group_pending,
    S.RUNNING: _group_running,
    S.SUCCEEDED: _group_succeeded,
}


def _reconcile_attempt(
    executor: Executor,
    attempt: Attempt,
    obs: Observation | None,
    now: dt.datetime,
    grace_s: int = 0,
) -> None:
    if not attempt.job_ref:
        _repair_launch(executor, attempt, now)
        return
    if obs is None:
        _maybe_lost(attempt, now)
        return
    target = executor.STATE_TABLE.get(obs.native_state)
    if target is None:  # recorded by _record_native; the job keeps its status
        return
    job = attempt.job
    if lending.ends_preempted(attempt.preempted_at, target, obs.end_time):
        preemption.pause(
            attempt,
            now,
            end=obs.end_time,
            started=obs.start_time,
            code=obs.exit_code,
            engine=_engine(obs),
        )
        return
    if lending.past_grace(attempt.preempted_at, grace_s, now):
        log.info("preempted %s is past its grace of %s s: cancelling", attempt.job_ref, grace_s)
        executor.cancel(attempt.job_ref)
    if target in (S.PENDING, S.RUNNING) and job.status == S.RUNNING:
        if reason := _time_limit_reached(attempt, now):
            # Stopped as a person's stop is (closed now, cancelled after commit), and never
            # retried automatically: a retry would run into the same limit.
            expected = {S.RUNNING}
            halt([job.pk], S.STOPPED, reason, actor="reconciler", now=now, expected=expected)
            return
    if target == S.PENDING:
        if attempt.job.status == S.RUNNING:
            return  # started already (a requeue shows as a failure): no step back, no deadline
        advance(job, [S.PENDING], _PENDING_REASON, actor="reconciler", attempt=attempt.number)
        _check_pending_deadline(executor, attempt, now)
    elif target == S.RUNNING:
        _mark_running(attempt, obs, now)
    else:
        _finish(attempt, target, obs, now)


def _repair_launch(executor: Executor, attempt: Attempt, now: dt.datetime) -> None:
    if (now - attempt.submitted_at).total_seconds() < settings.SF_LAUNCH_STUCK_S:
        return  # the launch task may still be running
    ref = executor.find(attempt.backend_name)
    if ref is None:
        launch_attempts([attempt.pk])  # nothing under the deterministic name: launch it now
        return
    with transaction.atomic():
        Attempt.objects.filter(pk=attempt.pk, job_ref="").update(job_ref=ref, pending_at=now)
        transition(
            attempt.job_id,
            S.PENDING,
            reason=f"adopted existing backend object {ref}",
            actor="reconciler",
            expected={S.SUBMITTED},
            attempt=attempt.number,
        )


def _maybe_lost(attempt: Attempt, now: dt.datetime) -> None:
    if attempt.last_seen_at:  # the last sighting was up to SEEN_RESOLUTION after it
        last = attempt.last_seen_at + SEEN_RESOLUTION
    else:
        last = attempt.pending_at or attempt.submitted_at
    if lending.gone_preempted(attempt.preempted_at, last, now):
        preemption.pause(attempt, now)
        return
    if (now - last).total_seconds() < settings.SF_LOST_GRACE_S:
        return
    reason = (
        f"lost on backend: {attempt.job_ref} is no longer known to cluster "
        f"{attempt.job.cluster.name}"
    )
    ends.end_attempt(attempt, End(S.FAILED, reason, at=now, failure=Failure.LOST), now)


def _mark_running(attempt: Attempt, obs: Observation, now: dt.datetime) -> None:
    if attempt.job.status == S.RUNNING:
        return
    with transaction.atomic():
        # Engines report whole seconds (Kubernetes) or round them: clocks bounds the start
        # by the admission, so queued time is never billed (invariant 5).
        clocks.mark_started(attempt, obs.start_time or now, now)
        advance(
            attempt.job,
            [S.PENDING, S.RUNNING],
            _RUNNING_REASON,
            actor="reconciler",
            attempt=attempt.number,
        )


def past_time_limit(limit_s: int | None, start: dt.datetime | None, now: dt.datetime) -> bool:
    """The attempt has been up for longer than the job's time limit."""
    if not limit_s or start is None:
        return False
    return (now - start).total_seconds() > limit_s


def _time_limit_reached(attempt: Attempt, end: dt.datetime) -> str:
    """The status reason of an attempt that, up since its start, ran past its job's time limit
    by `end`; "" if it did not (or has no limit)."""
    limit, start = attempt.job.time_limit_s, attempt.start_time
    if not limit or start is None or not past_time_limit(limit, start, end):
        return ""
    return time_limit_reason(limit, (end - start).total_seconds())


def _finish(attempt: Attempt, target: JobStatus, obs: Observation, now: dt.datetime) -> None:
    end = _observed_end(attempt, target, obs, now)
    if obs.start_time is None:  # the runner may have reported it since this tick read the attempt
        attempt.refresh_from_db(fields=["start_time", "alive_at"])
    ends.end_attempt(attempt, end, now)


def _observed_end(attempt: Attempt, target: JobStatus, obs: Observation, now: dt.datetime) -> End:
    """The end the engine reported, in the ledger's words: the reason, its cause, the note on
    how it was learnt."""
    # The engine's own limit (Slurm's --time, a Kubernetes Job's activeDeadlineSeconds) ended
    # it before a tick of the reconciler did. A cluster's own, shorter limit is not the job's:
    # only a run past the job's limit is a time-limit stop.
    if target == S.FAILED and obs.failure in Failure.time_limits():
        if reason := _time_limit_reached(attempt, obs.end_time or now):
            return End(
                S.STOPPED,
                reason,
                at=obs.end_time,
                exit_code=obs.exit_code,
                engine=_engine(obs),
            )
    if target == S.SUCCEEDED:
        reason = _SUCCEEDED_REASON
    elif target == S.STOPPED:  # stopped on the engine by someone, not through Starforge
        reason = obs.message or f"backend reported {obs.native_state}"
    else:
        reason = _failure_reason(attempt, obs)
    # An engine's own limit that was not the job's (a Slurm partition's) is kept as an exit.
    failure = Failure.recorded_as(obs.failure) if target == S.FAILED else ""
    return End(
        target,
        reason,
        at=obs.end_time,
        started=obs.start_time,
        exit_code=obs.exit_code,
        failure=failure,
        note=str(obs.details.get("note", "")),
        engine=_engine(obs),
    )


def _engine(obs: Observation) -> clocks.EngineTimes:
    """The engine's own times in an observation, as the clocks take them."""
    return clocks.EngineTimes(obs.engine_start, obs.engine_end, obs.engine_start_bills)


def _failure_reason(attempt: Attempt, obs: Observation) -> str:
    if obs.message.startswith(INGEST_FAILED):  # the runner's own sentence (sf.contract)
        return obs.message
    if obs.exit_code is not None and obs.exit_code < 0:
        head = f"killed by signal {-obs.exit_code}"
    elif obs.exit_code is not None:
        head = f"exited with code {obs.exit_code}"
    else:
        head = obs.message or f"backend reported {obs.native_state}"
    if obs.failure in FAILURE_WORDS:  # the backend's diagnosis comes first
        head = f"{FAILURE_WORDS[obs.failure]} ({head})"
    rank = _failed_rank(attempt, obs)
    if rank is not None:  # a multi-node job: which rank failed first, and its own last lines
        head = f"rank {rank['rank']} on {rank['node']} {head}; every other rank was ended"
        tail = logstore.tail_text(attempt.job_id, attempt.number, 5, rank=rank["rank"])
        return f"{head}; its last lines:\n{tail}" if tail else head
    tail = logstore.tail_text(attempt.job_id, attempt.number, 5)
    return f"{head}; last lines:\n{tail}" if tail else head


def _failed_rank(attempt: Attempt, obs: Observation) -> dict | None:
    """The kept row of the rank the engine says failed first, if it says so."""
    failed = obs.details.get("failed_rank")
    if attempt.nodes < 2 or type(failed) is not int:
        return None
    ranks = attempt.ranks  # this tick's rows, checked by _record_ranks
    return ranks[failed] if 0 <= failed < len(ranks) else None


def _past_pending_deadline(attempt: Attempt, now: dt.datetime) -> bool:
    deadline = attempt.job.pending_deadline_s or settings.SF_PENDING_DEADLINE_S
    since = attempt.pending_at or attempt.submitted_at
    return (now - since).total_seconds() > deadline


def _check_pending_deadline(executor: Executor, attempt: Attempt, now: dt.datetime) -> None:
    if not _past_pending_deadline(attempt, now):
        return
    deadline = attempt.job.pending_deadline_s or settings.SF_PENDING_DEADLINE_S
    reason = f"pending deadline: still PENDING after {deadline} s; cancelled on the backend"
    up = sum(1 for r in attempt.ranks if r["state"] == "running")  # as _record_ranks kept
    if up:  # never a partial start: the ranks that did start are cancelled with the rest
        reason = (
            f"not all nodes started: {up} of {attempt.nodes} ranks running after the pending "
            f"deadline of {deadline} s; every started rank was cancelled"
        )
    ends.end_attempt(attempt, End(S.FAILED, reason, at=now, failure=Failure.DEADLINE), now)
    executor.cancel(attempt.job_ref)


def _record_native(
    executor: Executor, open_attempts: list[Attempt], observations: dict[int, Observation]
) -> None:
    """Keep each attempt's native state and the backend's words for a wait, as they change.

    One UPDATE per distinct value, not per attempt: a tick over a thousand jobs that all went
    PENDING at once costs a handful of statements. A state outside the executor's table also
    gets an observation event (the Diagnostics tab lists them).
    """
    states: dict[str, list[int]] = defaultdict(list)
    messages: dict[str, list[int]] = defaultdict(list)
    unmapped = []
    for attempt in open_attempts:
        obs = observations.get(attempt.pk)
        if obs is None:
            continue
        target = executor.STATE_TABLE.get(obs.native_state)
        if obs.native_state != attempt.native_state:
            states[obs.native_state[:50]].append(attempt.pk)
            if target is None:
                unmapped.append(
                    JobEvent(
                        job_id=attempt.job_id,
                        kind=JobEvent.Kind.OBSERVATION,
                        actor="reconciler",
                        attempt=attempt.number,
                        reason=(
                            f"unmapped backend state {obs.native_state!r}; the job keeps its status"
                        ),
                        data={"native_state": obs.native_state, "message": obs.message},
                    )
                )
        if target == S.PENDING and obs.message != attempt.native_message:
            messages[obs.message].append(attempt.pk)
    for state, ids in states.items():
        Attempt.objects.filter(pk__in=ids).update(native_state=state)
    for message, ids in messages.items():
        Attempt.objects.filter(pk__in=ids).update(native_message=message)
    JobEvent.objects.bulk_create(unmapped)


def _record_ranks(
    executor: Executor, open_attempts: list[Attempt], observations: dict[int, Observation]
) -> None:
    """Keep each attempt's ranks as the engine last reported them (node, state, exit code),
    checked: an engine's rows may come from a record job code could reach. Where it reports
    only the nodes it gave the attempt, the rows come from those (`allocation_ranks`)."""
    for attempt in open_attempts:
        obs = observations.get(attempt.pk)
        if obs is None:
            continue
        if "ranks" in obs.details:
            ranks = checked_ranks(obs.details["ranks"], attempt.nodes)
        else:
            ranks = allocation_ranks(executor, attempt, obs)
        known = {r["rank"]: r["node"] for r in attempt.ranks or [] if isinstance(r, dict)}
        for row in ranks:  # a rank whose pod is gone no longer says where it ran
            if not row["node"] and known.get(row["rank"]):
                row["node"] = known[row["rank"]]
        if ranks and ranks != attempt.ranks:
            Attempt.objects.filter(pk=attempt.pk).update(ranks=ranks)
            attempt.ranks = ranks


# A rank's state where the engine reports only its allocation: the attempt's own (a stop
# ends it as a stop ends a rank, "killed").
RANK_STATE_OF = {
    S.RUNNING: "running",
    S.SUCCEEDED: "succeeded",
    S.FAILED: "failed",
    S.STOPPED: "killed",
}


def allocation_ranks(executor: Executor, attempt: Attempt, obs: Observation) -> list[dict]:
    """Rank rows from the nodes the engine gave the attempt (`details["nodes"]`, rank r on
    the r-th: Slurm's NodeList), so that every attempt keeps where it ran (a retry after a hang
    keeps off there). A single-node attempt's one rank is the attempt: its state and exit code.
    A multi-node attempt's rows come from its runner, which reports each rank; these stand in
    only until it has."""
    nodes = obs.details.get("nodes")
    target = executor.STATE_TABLE.get(obs.native_state)
    if not isinstance(nodes, list) or target not in RANK_STATE_OF:
        return []
    if attempt.nodes > 1 and attempt.ranks:
        return []
    state = RANK_STATE_OF[target]
    code = obs.exit_code if attempt.nodes == 1 else None
    rows = [{"rank": r, "node": n, "state": state, "exit_code": code} for r, n in enumerate(nodes)]
    return checked_ranks(rows, attempt.nodes)


def checked_ranks(rows: object, nodes: int) -> list[dict]:
    """Rank rows as the ledger keeps them: one per rank 0..nodes-1, in rank order, with a
    short node name, a known state and an int exit code or None; [] when they are not that."""
    if not isinstance(rows, list) or len(rows) != nodes:
        return []
    if not all(isinstance(row, dict) for row in rows):
        return []
    out = []
    in_order = sorted(rows, key=lambda r: r["rank"] if type(r.get("rank")) is int else -1)
    for index, row in enumerate(in_order):
        if row.get("rank") != index:
            return []
        node, state, code = row.get("node"), row.get("state"), row.get("exit_code")
        if not isinstance(node, str) or state not in RANK_STATES + ("pending",):
            return []
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            return []
        out.append({"rank": index, "node": node[:100], "state": state, "exit_code": code})
    return out


def _sweep_orphan(
    executor: Executor, attempt: Attempt, obs: Observation | None, now: dt.datetime
) -> None:
    """A closed attempt (stopped or paused): make sure its backend object is gone.

    It may still run (a stop racing a launch): cancel it again. And if it was closed before
    the reconciler saw it start, take the start time the backend reports, so the GPU-seconds
    up to the stop are counted.
    """
    if obs is None:
        return
    if executor.STATE_TABLE.get(obs.native_state) in (S.PENDING, S.RUNNING):
        log.info("cancelling orphaned backend object %s", attempt.job_ref)
        executor.cancel(attempt.job_ref)
    if attempt.start_time is None and obs.start_time and attempt.end_time:
        # Metered already with no start (0 GPU-µs): metering it again adds exactly its time.
        clocks.mark_started(attempt, obs.start_time, now, reopen=True)
    # How the engine ended it (Slurm: CANCELLED after a stop or a pause), and when.
    if obs.native_state != attempt.native_state:
        Attempt.objects.filter(pk=attempt.pk).update(native_state=obs.native_state[:50])
    clocks.engine_record(attempt, _engine(obs))
