"""The scheduler tick: admit QUEUED jobs through the window, quota and capacity gates.

One tick reads the whole queue in one query, keeps running sums per team and per cluster in
memory, and writes admissions and waiting reasons in batches, so its query count does not grow
with the queue. Admissions are serialised by a lock held for the tick's transaction (a
PostgreSQL advisory lock; SQLite's write lock on the embedded ledger), so two schedulers at
once never over-admit: the second one finds the lock taken and skips its tick.
"""

import datetime as dt
import logging
from collections import defaultdict
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.models import Count, F, OuterRef, Subquery, Sum
from django.utils import timezone

from jobs.executors import Capacity, executor_for
from jobs.lifecycle import requeue_due_retries
from jobs.models import Attempt, Cluster, Job, ScheduleWindow, Team
from jobs.states import JobStatus
from jobs.transitions import Change, apply_transitions
from jobs.windows import Window, WindowSpecError, parse_window

log = logging.getLogger(__name__)
ADVISORY_LOCK_KEY = 0x5F5C_4ED0  # any constant unique to Starforge's scheduler
# Bounds one tick's transaction; the next tick (kicked right away by the task) goes on.
MAX_ADMIT_PER_TICK = 5000


@dataclass
class TickResult:
    skipped: bool = False
    admitted: list[int] = field(default_factory=list)  # attempt ids to launch
    waiting: int = 0
    queries: int = 0


@dataclass
class _Usage:
    gpus: int = 0
    jobs: int = 0


def admit_queued_jobs(now: dt.datetime | None = None) -> TickResult:
    """One scheduler tick. Safe to run concurrently and repeatedly."""
    now = now or timezone.now()
    requeue_due_retries(now)  # cooled-down FAILED jobs join this tick's queue
    capacities = _cluster_capacities()  # asks the engines, outside any transaction
    with transaction.atomic():
        if not _take_scheduler_lock():
            return TickResult(skipped=True)
        result = _admit(now, capacities)
    return result


def _admit(now: dt.datetime, capacities: dict[int, tuple[Cluster, Capacity]]) -> TickResult:
    teams = {t.pk: t for t in Team.objects.all()}
    windows = _windows()
    team_use = _usage("team")
    cluster_use = _usage("cluster")
    queue = (
        Job.objects.filter(status=JobStatus.QUEUED)
        .order_by("-priority", "submitted_at", "id")
        .values_list("id", "team_id", "cluster_id", "gpus", "window_id", "status_reason")
    )
    admit: list[tuple[int, int]] = []
    reasons: dict[str, list[int]] = defaultdict(list)
    for job_id, team_id, cluster_id, gpus, window_id, old_reason in queue:
        team = teams[team_id]
        window_key = window_id or team.window_id
        window = windows.get(window_key) if window_key else None
        reason = _gate(
            now,
            team,
            team_use[team_id],
            capacities.get(cluster_id),
            cluster_use[cluster_id],
            gpus,
            window,
        )
        if reason is None:
            if len(admit) >= MAX_ADMIT_PER_TICK:
                break
            admit.append((job_id, gpus))
            team_use[team_id].gpus += gpus
            team_use[team_id].jobs += 1
            cluster_use[cluster_id].gpus += gpus
            cluster_use[cluster_id].jobs += 1
        elif reason != old_reason:
            reasons[reason].append(job_id)
    for reason, ids in reasons.items():
        # A waiting reason is not a status change: no event, and only QUEUED rows are touched.
        Job.objects.filter(pk__in=ids, status=JobStatus.QUEUED).update(status_reason=reason)
    attempt_ids = _submit(admit, now)
    return TickResult(admitted=attempt_ids, waiting=sum(len(v) for v in reasons.values()))


def _gate(
    now, team: Team, team_use: _Usage, cap, cluster_use: _Usage, gpus: int, window: Window | None
) -> str | None:
    """Why this job cannot be admitted now, in words a user understands; None when it can."""
    if window is not None and not window.is_open(now):
        return window.describe_wait(now)
    if team_use.gpus + gpus > team.gpu_quota:
        return (
            f"waiting for quota: team {team.name} uses {team_use.gpus} of "
            f"{team.gpu_quota} GPUs; this job needs {gpus}"
        )
    if cap is None:
        return "waiting for capacity: the job's cluster is disabled"
    cluster, capacity = cap
    if not capacity.reachable:
        return f"waiting for cluster {cluster.name}: it cannot be reached ({capacity.message})"
    free = capacity.total_gpus - cluster_use.gpus
    if gpus > free:
        kind = "virtual GPU slots" if capacity.virtual else "GPUs"
        return (
            f"waiting for capacity: cluster {cluster.name} has {max(free, 0)} of "
            f"{capacity.total_gpus} {kind} free; this job needs {gpus}"
        )
    if capacity.max_jobs is not None and cluster_use.jobs >= capacity.max_jobs:
        return (
            f"waiting for capacity: cluster {cluster.name} runs {cluster_use.jobs} of "
            f"{capacity.max_jobs} jobs it allows at once"
        )
    return None


def _submit(admit: list[tuple[int, int]], now: dt.datetime) -> list[int]:
    if not admit:
        return []
    gpus_by_job = dict(admit)
    changed, _ = apply_transitions(
        JobStatus.SUBMITTED,
        [Change(job_id, "admitted; launching") for job_id, _ in admit],
        actor="scheduler",
        expected={JobStatus.QUEUED},
    )
    jobs = list(
        Job.objects.filter(pk__in=[j.pk for j in changed]).only("id", "run_id", "attempt_count")
    )
    attempts = [
        Attempt(
            job_id=job.pk,
            number=job.attempt_count + 1,
            gpus=gpus_by_job[job.pk],
            backend_name=backend_name(job.run_id, job.attempt_count + 1),
            submitted_at=now,
        )
        for job in jobs
    ]
    Attempt.objects.bulk_create(attempts, batch_size=1000)
    newest = Attempt.objects.filter(job_id=OuterRef("pk")).order_by("-number").values("pk")[:1]
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(
        attempt_count=F("attempt_count") + 1, current_attempt=Subquery(newest)
    )
    return [a.pk for a in attempts]


def backend_name(run_id: str, attempt: int) -> str:
    """The deterministic backend object name: the key of at-most-once launch (invariant 4)."""
    return f"sf-{run_id}-a{attempt}"


def _usage(by: str) -> dict[int, _Usage]:
    usage: dict[int, _Usage] = defaultdict(_Usage)
    rows = (
        Job.objects.filter(status__in=JobStatus.holds_quota())
        .values(by)
        .annotate(gpus=Sum("gpus"), jobs=Count("id"))
    )
    for row in rows:
        usage[row[by]] = _Usage(row["gpus"] or 0, row["jobs"])
    return usage


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
        _record_reachability(cluster, capacity)
    return capacities


def _record_reachability(cluster: Cluster, capacity: Capacity) -> None:
    if capacity.reachable:
        if cluster.unreachable_since:
            Cluster.objects.filter(pk=cluster.pk).update(
                unreachable_since=None, unreachable_reason=""
            )
        return
    reason = capacity.message or "no reason given"
    if cluster.unreachable_since is None or cluster.unreachable_reason != reason:
        Cluster.objects.filter(pk=cluster.pk).update(
            unreachable_since=cluster.unreachable_since or timezone.now(),
            unreachable_reason=reason,
        )


def _take_scheduler_lock() -> bool:
    if connection.vendor != "postgresql":
        return True  # SQLite: the IMMEDIATE transaction already holds the database write lock
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])
        return bool(cursor.fetchone()[0])
