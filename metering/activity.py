"""Owns what an attempt's GPUs did: the runner's activity reports rolled up into active and
idle GPU-microseconds, when the attempt last worked and last moved, and the figures every
reader shows (docs/ARCHITECTURE.md, invariant 5: metering alone multiplies time by GPUs).

A report (`sf.activity`) says per rank what happened since the previous one: lines written,
CPU seconds of its process group, each GPU's highest utilisation; per attempt, metric points
logged. Everything in it is the job's to forge, so it is a claim bounded by the server:
- the interval a report covers is the server's time since the previous report, at most
  `GAP_CAP_S` (a runner that was silent longer gets no credit for the silence), and nothing
  accrues before the attempt's billed start;
- a rank's GPUs are its share of the attempt's (`total_gpus / nodes`); a GPU is active in the
  interval when its utilisation reached the threshold (`SF_IDLE_GPU_UTIL_PERCENT`, 10 by
  default), and without NVML readings all of a rank's GPUs are active when the rank made
  progress (a line, CPU above `CPU_FLOOR` of a core, a metric point) and idle when not;
- readers clamp active + idle to the billed GPU-time (`figures`), so no report makes an
  attempt look like it ran more than it was billed.
A silent runner refreshes nothing: for the policies its job stays idle and still.

One locked read and one update per report, never a query per sample.
"""

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from jobs.errors import BadRequest
from jobs.models import Attempt
from jobs.watched import AttemptActivity
from metering.usage import attempt_gpu_seconds

GAP_CAP_S = 60.0  # the most one report is credited with
CPU_FLOOR = 0.02  # of one core: below it a rank's CPU is flat
MAX_GPUS_PER_RANK = 64
MAX_COUNT = 10**9


def util_threshold() -> float:
    return float(settings.SF_IDLE_GPU_UTIL_PERCENT)


@dataclass(frozen=True)
class RankReport:
    rank: int
    lines: int
    cpu_s: float | None
    gpu_util: list[float]


@dataclass(frozen=True)
class Report:
    steps: int
    ranks: list[RankReport]


def parse_report(body: dict[str, Any], nodes: int) -> Report:
    """The report's figures checked, or BadRequest with the sentence saying which is wrong."""
    steps = _count(body.get("steps", 0), '"steps"')
    raw = body.get("ranks", [])
    if not isinstance(raw, list) or len(raw) > nodes:
        raise BadRequest(f'"ranks" must be a list of at most {nodes} rank(s)')
    ranks, seen = [], set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"ranks[{i}] must be an object")
        rank = _count(item.get("rank"), f"ranks[{i}].rank")
        if rank >= nodes or rank in seen:
            raise BadRequest(f"ranks[{i}].rank must be a distinct rank below {nodes}")
        seen.add(rank)
        cpu = item.get("cpu_s")
        if cpu is not None and not _nonnegative(cpu):
            raise BadRequest(f"ranks[{i}].cpu_s must be a non-negative number or null")
        utils = item.get("gpu_util", [])
        if not isinstance(utils, list) or len(utils) > MAX_GPUS_PER_RANK:
            raise BadRequest(f"ranks[{i}].gpu_util must be a list of at most 64 numbers")
        if not all(_nonnegative(u) and u <= 100 for u in utils):
            raise BadRequest(f"ranks[{i}].gpu_util must hold percents from 0 to 100")
        lines = _count(item.get("lines", 0), f"ranks[{i}].lines")
        ranks.append(RankReport(rank, lines, cpu, [float(u) for u in utils]))
    return Report(steps, ranks)


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise BadRequest(f"{what} must be a whole number from 0 to {MAX_COUNT}")
    return value


def _nonnegative(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True)
class Interval:
    """What one report adds: GPU-µs active and idle, and who worked or moved."""

    active_us: int
    idle_us: int
    busy: bool  # some GPU worked (or, without NVML, some rank moved)
    moved: bool  # some rank made progress, or the job logged a metric point
    moved_ranks: list[int]


def interval(report: Report, gpus_per_rank: int, seconds: float, threshold: float) -> Interval:
    """One report's interval judged: per rank, its GPUs active or idle, and whether it moved."""
    micros = round(max(0.0, seconds) * 1_000_000)
    active = idle = 0
    busy = False
    moved_ranks = []
    for rank in report.ranks:
        utils = rank.gpu_util[:gpus_per_rank]
        cpu_moved = rank.cpu_s is not None and rank.cpu_s > CPU_FLOOR * max(seconds, 1e-3)
        working = [u >= threshold for u in utils]
        if rank.lines or cpu_moved or any(working):
            moved_ranks.append(rank.rank)
        if utils:
            rank_active = sum(working)
        else:
            rank_active = gpus_per_rank if rank.rank in moved_ranks else 0
        busy = busy or (any(working) if utils else rank.rank in moved_ranks)
        active += rank_active * micros
        idle += (gpus_per_rank - rank_active) * micros
    moved = bool(moved_ranks) or report.steps > 0
    return Interval(active, idle, busy or report.steps > 0, moved, moved_ranks)


def observe(attempt: Attempt, report: Report, now: dt.datetime) -> AttemptActivity:
    """Add a report to its attempt's activity, by the server's clock; returns the row."""
    gpus_per_rank = attempt.total_gpus // max(attempt.nodes, 1)
    start = attempt.start_time
    with transaction.atomic():
        row, _ = AttemptActivity.objects.select_for_update().get_or_create(
            attempt_id=attempt.pk,
            defaults={
                "busy_at": start or now,
                "moved_at": start or now,
                "stepped_at": start or now,
            },
        )
        since = max(filter(None, (row.reported_at, start)), default=now)
        seconds = min(GAP_CAP_S, (now - since).total_seconds()) if start else 0.0
        judged = interval(report, gpus_per_rank, seconds, util_threshold())
        row.active_gpu_us += judged.active_us
        row.idle_gpu_us += judged.idle_us
        row.reported_at, row.reports = now, row.reports + 1
        if judged.busy:
            row.busy_at = now
        if judged.moved:
            row.moved_at = now
        if report.steps:
            row.stepped_at = now
        for rank in report.ranks:  # a rank reported is watched from the attempt's start
            row.ranks_moved.setdefault(str(rank.rank), (start or now).timestamp())
        for moved in judged.moved_ranks:
            row.ranks_moved[str(moved)] = now.timestamp()
        row.save()
    return row


@dataclass(frozen=True)
class ActivityFigures:
    active_gpu_s: float
    idle_gpu_s: float
    efficiency: float | None  # active / billed; None before anything was billed


def attempt_figures(
    active_us: int | None,
    idle_us: int | None,
    start: dt.datetime | None,
    end: dt.datetime | None,
    total_gpus: int,
    now: dt.datetime,
) -> ActivityFigures:
    """One attempt's figures from its activity row's counters (None: it reported nothing)."""
    billed = attempt_gpu_seconds(start, end, total_gpus, now) if start else 0.0
    return figures(active_us or 0, idle_us or 0, billed)


def figures(active_us: int, idle_us: int, billed_gpu_s: float) -> ActivityFigures:
    """The figures readers show, clamped to the billed GPU-time (a report is a claim)."""
    billed_us = max(0, round(billed_gpu_s * 1_000_000))
    active = min(active_us, billed_us)
    idle = min(idle_us, billed_us - active)
    efficiency = round(active / billed_us, 4) if billed_us else None
    return ActivityFigures(active / 1e6, idle / 1e6, efficiency)


def team_activity_month(now: dt.datetime) -> dict[int, tuple[int, int]]:
    """Active and idle GPU-µs per team this UTC month: the usage records' (ended attempts) and
    the running attempts' counters so far (their clamp to what was billed comes at the end)."""
    from django.db.models import Sum

    from metering.models import UsageRecord

    first = now.date().replace(day=1)
    totals: dict[int, list[int]] = {}
    rows = (
        UsageRecord.objects.filter(day__gte=first)
        .values("team_id")
        .annotate(on=Sum("active_gpu_us"), off=Sum("idle_gpu_us"))
        .values_list("team_id", "on", "off")
    )
    for team, on, off in rows:
        totals[team] = [on or 0, off or 0]
    running = AttemptActivity.objects.filter(
        attempt__metered=False, attempt__start_time__isnull=False
    ).values_list("attempt__job__team_id", "active_gpu_us", "idle_gpu_us")
    for team, on, off in running:
        pair = totals.setdefault(team, [0, 0])
        pair[0] += on
        pair[1] += off
    return {team: (on, off) for team, (on, off) in totals.items()}


def job_efficiency(attempts: list, now: dt.datetime) -> float | None:
    """Active ÷ billed GPU-seconds over a job's attempts (each attempt's activity clamped to
    what it was billed); None before any was billed. `attempts` carry their `activity` row
    where they have one (`select_related("activity")`)."""
    active_us = billed_us = 0
    for attempt in attempts:
        if attempt.start_time is None:
            continue
        billed = attempt_gpu_seconds(attempt.start_time, attempt.end_time, attempt.total_gpus, now)
        row = attempt.activity if hasattr(attempt, "activity") else None
        shown = figures(row.active_gpu_us if row else 0, row.idle_gpu_us if row else 0, billed)
        active_us += round(shown.active_gpu_s * 1e6)
        billed_us += round(billed * 1e6)
    return round(active_us / billed_us, 4) if billed_us else None
