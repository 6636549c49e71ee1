"""Writing and reading usage records.

`meter_ended` moves ended attempts into the records exactly once (their `metered` flag flips in
the same transaction). `usage_rows` answers "GPU-µs per day/team/user/cluster/GPU type in a
range" from the records plus the attempts not in them yet (running, or ended since the last
sweep), so an answer is exact at any moment without scanning every attempt. A record's GPU type
is the one its jobs asked for ("": any), the type their cost is priced by.
"""

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Q, QuerySet, Sum
from django.db.models.functions import Greatest
from django.utils import timezone

from jobs.models import Attempt, AttemptActivity
from jobs.reads.prepared import Prepared
from metering.models import UsageRecord
from metering.prices import PriceBook, Schedule, cost_of, price_spans, read_prices

SWEEP_BATCH = 5000
# How long the sweep leaves an ended attempt unmetered for its engine's end to bound its bill
# (`awaiting_engine`). Only an engine that had ended the attempt before the server closed it
# (a stop, a pause) can bound it, and that engine knows its end already: the reconciler,
# polling every 2 s, takes it (`jobs.ledger.clocks.engine_record`) on its next poll; 15 ticks
# leave room for failed polls. Far within the 10 minutes after an end that the reconciler
# still polls it (`jobs.loops.reconciler.ORPHAN_SWEEP`) and after which `check_usage` calls
# an unmetered attempt stuck (`metering.consistency.STUCK_AFTER`). An engine that never says
# (the local executor) only delays its attempts' records by this much: usage answers add
# unmetered attempts as they read.
ENGINE_END_GRACE = dt.timedelta(seconds=30)
ONE_US = dt.timedelta(microseconds=1)
IN = ("team", "user")  # a usage read's id parameters: team0, team1, ..., user0, ...
Key = tuple[dt.date, int, int, int, str]  # day, team_id, user_id, cluster_id, gpu_type
KEY_COLUMNS = ("day", "team_id", "user_id", "cluster_id", "gpu_type")  # a record's Key


def day_pieces(
    start: dt.datetime | None, end: dt.datetime | None, total_gpus: int, now: dt.datetime | None
) -> Iterator[tuple[dt.date, int]]:
    """(UTC day, GPU-µs) pieces of one attempt's running time up to its end, or `now` while it
    runs; nothing if it never ran."""
    stop = end or now
    if start is None or stop is None or total_gpus == 0:
        return
    lo, hi = start.astimezone(dt.UTC), stop.astimezone(dt.UTC)
    while lo < hi:
        midnight = dt.datetime.combine(lo.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
        piece_end = min(hi, midnight)
        yield lo.date(), (piece_end - lo) // ONE_US * total_gpus
        lo = piece_end


def priced_day_pieces(
    start: dt.datetime | None,
    end: dt.datetime | None,
    total_gpus: int,
    schedule: Schedule,
    now: dt.datetime | None,
) -> Iterator[tuple[dt.date, int, int]]:
    """(UTC day, GPU-µs, cost in micro-units) pieces of one attempt's running time, cut where
    the price changes as well as at midnight: each part costs the price in force when it ran."""
    stop = end or now
    if start is None or stop is None:
        return
    for lo, hi, rate in price_spans(start, stop, schedule):
        for day, gpu_us in day_pieces(lo, hi, total_gpus, hi):
            yield day, gpu_us, cost_of(gpu_us, rate)


def awaiting_engine(now: dt.datetime) -> Q:
    """Ended attempts whose engine may still bound their bill: launched on an engine (a
    `job_ref`), started, ended within ENGINE_END_GRACE, and either without the engine's end
    or billed past it (the end `engine_record` brings back within it, not written yet)."""
    return (
        ~Q(job_ref="")
        & Q(start_time__isnull=False, end_time__gt=now - ENGINE_END_GRACE)
        & (Q(engine_end__isnull=True) | Q(end_time__gt=Greatest(F("engine_end"), F("start_time"))))
    )


def meter_ended(
    job_ids: Iterable[int] | None = None, now: dt.datetime | None = None, *, wait: bool = True
) -> int:
    """Add ended, unmetered attempts to the usage records; returns how many were added.

    Never bills more than the engine: an attempt whose engine may still bound its end
    (`awaiting_engine`) waits for it, at most ENGINE_END_GRACE after its end; without `wait`
    (a job being deleted) every ended attempt is taken.

    Safe to run concurrently: the attempts are locked (PostgreSQL) or the write lock is held
    (SQLite, IMMEDIATE transactions), and only rows still unmetered are taken.
    """
    now = now or timezone.now()
    added = 0
    while True:
        with transaction.atomic():
            rows = Attempt.objects.filter(metered=False, end_time__isnull=False)
            if job_ids is not None:
                rows = rows.filter(job_id__in=list(job_ids))
            if wait:
                rows = rows.exclude(awaiting_engine(now))
            if connection.vendor == "postgresql":
                rows = rows.select_for_update(skip_locked=True, of=("self",))
            batch = list(
                rows.values_list(
                    "pk", "job__team_id", "job__user_id", "job__cluster_id",
                    "start_time", "end_time", "total_gpus", "borrowed_from_id", "job__gpu_type",
                    "activity__active_gpu_us", "activity__idle_gpu_us",
                )[:SWEEP_BATCH]
            )  # fmt: skip
            if not batch:
                return added
            _add_batch(batch, read_prices())
            Attempt.objects.filter(pk__in=[row[0] for row in batch]).update(metered=True)
            added += len(batch)
        if len(batch) < SWEEP_BATCH:
            return added


def _add_batch(batch: list[tuple], prices: PriceBook) -> None:
    """Add a sweep's ended attempts (rows of meter_ended's columns) to the records: their
    GPU-µs, the part on borrowed GPUs, and their cost at the prices in force when they ran."""
    totals: dict[Key, int] = defaultdict(int)
    borrowed: dict[Key, int] = defaultdict(int)
    costs: dict[Key, int] = defaultdict(int)
    active: dict[Key, int] = defaultdict(int)
    idle: dict[Key, int] = defaultdict(int)
    for _, team, user, cluster, start, end, total_gpus, lender, gpu_type, *worked in batch:
        schedule = prices.schedule(cluster, gpu_type)
        pieces = list(priced_day_pieces(start, end, total_gpus, schedule, end))
        for day, gpu_us, cost in pieces:
            totals[(day, team, user, cluster, gpu_type)] += gpu_us
            costs[(day, team, user, cluster, gpu_type)] += cost
            if lender is not None:
                borrowed[(day, team, user, cluster, gpu_type)] += gpu_us
        for (day, _, _), (on, off) in zip(pieces, _activity_pieces(pieces, *worked), strict=True):
            active[(day, team, user, cluster, gpu_type)] += on
            idle[(day, team, user, cluster, gpu_type)] += off
    _add(totals)
    _add(borrowed, column="borrowed_gpu_us")
    _add(costs, column="cost_micros")
    _add(active, column="active_gpu_us")
    _add(idle, column="idle_gpu_us")


def _activity_pieces(
    pieces: list[tuple[dt.date, int, int]], active_us: int | None, idle_us: int | None
) -> list[tuple[int, int]]:
    """An ended attempt's active and idle GPU-µs, clamped to its billed GPU-µs and spread over
    its day pieces  in proportion to each day's GPU-µs."""
    billed = sum(gpu_us for _, gpu_us, _ in pieces)
    active = min(active_us or 0, billed)
    idle = min(idle_us or 0, billed - active)
    if not billed:
        return [(0, 0) for _ in pieces]
    out = [(active * gpu_us // billed, idle * gpu_us // billed) for _, gpu_us, _ in pieces]
    if out:  # what integer division left goes to the last day, so the sums are exact
        last_on, last_off = out[-1]
        out[-1] = (
            last_on + active - sum(on for on, _ in out),
            last_off + idle - sum(off for _, off in out),
        )
    return out


# The records' figures; `_add` adds to one of them at a time.
ADDED = (
    "gpu_us",
    "deleted_gpu_us",
    "borrowed_gpu_us",
    "cost_micros",
    "active_gpu_us",
    "idle_gpu_us",
)


def _add(totals: dict[Key, int], column: str = "gpu_us") -> None:
    """Add `totals` to one column of the records, creating the rows that are missing."""
    if not totals:
        return
    table = UsageRecord._meta.db_table
    sql = (
        f"INSERT INTO {table} (day, team_id, user_id, cluster_id, gpu_type, {', '.join(ADDED)}) "
        f"VALUES (%s, %s, %s, %s, %s, {', '.join('%s' for _ in ADDED)}) "
        "ON CONFLICT (day, team_id, user_id, cluster_id, gpu_type) "
        f"DO UPDATE SET {column} = {table}.{column} + EXCLUDED.{column}"
    )
    # A deleted or borrowed part, or the cost, is of gpu_us, which is added first (same
    # transaction): a row this creates is one whose gpu_us was added by an earlier sweep.
    # In key order: two sweeps that share keys then lock their rows in the same order and
    # cannot deadlock.
    params: list[Any] = [
        (*key, *(value if name == column else 0 for name in ADDED))
        for key, value in sorted(totals.items())
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def forget_deleted(job_id: int) -> None:
    """Before a job's rows are deleted: meter its attempts, then mark that usage as deleted.

    The usage stays billed; the consistency check subtracts it, since its attempts are gone.
    """
    # Wait for a sweep that holds these attempts (its skip_locked would skip them here), so
    # everything it meters is counted as deleted below.
    list(Attempt.objects.select_for_update().filter(job_id=job_id).values_list("pk"))
    meter_ended([job_id], wait=False)
    totals: dict[Key, int] = defaultdict(int)
    rows = Attempt.objects.filter(job_id=job_id, metered=True).values_list(
        "job__team_id", "job__user_id", "job__cluster_id", "job__gpu_type",
        "start_time", "end_time", "total_gpus",
    )  # fmt: skip
    for team, user, cluster, gpu_type, start, end, total_gpus in rows:
        for day, gpu_us in day_pieces(start, end, total_gpus, end):
            totals[(day, team, user, cluster, gpu_type)] += gpu_us
    _add(totals, column="deleted_gpu_us")


def usage_rows(
    since: dt.date,
    until: dt.date,
    now: dt.datetime | None = None,
    teams: Iterable[int] | None = None,
    users: Iterable[int] | None = None,
) -> dict[Key, int]:
    """GPU-µs per (day, team, user, cluster, GPU type) for days in [since, until), records plus
    the attempts not recorded yet."""
    return usage_totals(since, until, now, teams, users)[0]


def usage_totals(
    since: dt.date,
    until: dt.date,
    now: dt.datetime | None = None,
    teams: Iterable[int] | None = None,
    users: Iterable[int] | None = None,
) -> tuple[dict[Key, int], dict[Key, int]]:
    """`usage_rows`, and in the same read the part of each that ran on GPUs borrowed from
    other teams (only keys with some)."""
    now = now or timezone.now()
    totals: dict[Key, int] = defaultdict(int)
    borrowed: dict[Key, int] = defaultdict(int)
    team_ids = None if teams is None else sorted(set(teams))
    user_ids = None if users is None else sorted(set(users))
    if team_ids == [] or user_ids == []:
        return totals, borrowed
    # Every usage answer reads these: their SQL is built once per shape (jobs.reads.prepared),
    # the shape being how many teams and users it is narrowed to (None: not narrowed).
    shape = tuple(None if pks is None else len(pks) for pks in (team_ids, user_ids))
    ids = {
        f"{kind}{i}": pk
        for kind, pks in zip(IN, (team_ids, user_ids), strict=True)
        for i, pk in enumerate(pks or ())
    }
    recorded, running = _read_consistently(
        lambda: RECORDS.rows(shape, since=since, until=until, **ids),
        lambda: UNRECORDED.rows(shape, midnight=_midnight(since), **ids),
    )
    for day, team, user, cluster, gpu_type, gpu_us, lent in recorded:
        totals[(day, team, user, cluster, gpu_type)] += gpu_us
        if lent:
            borrowed[(day, team, user, cluster, gpu_type)] += lent
    for team, user, cluster, gpu_type, start, end, total_gpus, lender in running:
        for day, gpu_us in day_pieces(start, end, total_gpus, now):
            if since <= day < until:
                totals[(day, team, user, cluster, gpu_type)] += gpu_us
                if lender is not None:
                    borrowed[(day, team, user, cluster, gpu_type)] += gpu_us
    return totals, borrowed


def _records(shape: tuple, since: dt.date, until: dt.date, **ids: int) -> QuerySet:
    records = UsageRecord.objects.filter(day__gte=since, day__lt=until)
    return _narrowed(records, shape, ids, "team_id", "user_id").values_list(
        *KEY_COLUMNS, "gpu_us", "borrowed_gpu_us"
    )


def _unrecorded_of(shape: tuple, midnight: dt.datetime, **ids: int) -> QuerySet:
    attempts = _unrecorded_since(midnight)
    narrowed = _narrowed(attempts, shape, ids, "job__team_id", "job__user_id")
    return narrowed.values_list(*UNRECORDED_COLUMNS)


def _narrowed(rows: QuerySet, shape: tuple, ids: dict[str, int], *fields: str) -> QuerySet:
    """`rows` of the teams and users `ids` names, by `fields` (the team's, the user's)."""
    for kind, count, field in zip(IN, shape, fields, strict=True):
        if count is not None:
            rows = rows.filter(**{f"{field}__in": [ids[f"{kind}{i}"] for i in range(count)]})
    return rows


UNRECORDED_COLUMNS = (
    "pk", "job__team_id", "job__user_id", "job__cluster_id", "job__gpu_type",
    "start_time", "end_time", "total_gpus", "borrowed_from_id",
)  # fmt: skip
RECORDS = Prepared(_records)
UNRECORDED = Prepared(_unrecorded_of)


def team_gpu_us(since: dt.date, now: dt.datetime) -> dict[int, int]:
    """GPU-µs per team from `since` (a UTC day) to now: the scheduler's budget and fair share."""
    by_team = UsageRecord.objects.filter(day__gte=since).values("team_id")
    records = by_team.annotate(us=Sum("gpu_us")).values_list("team_id", "us")
    unrecorded = _unrecorded_since(_midnight(since)).values_list(*UNRECORDED_COLUMNS)
    recorded, running = _read_consistently(lambda: list(records), lambda: list(unrecorded))
    totals: dict[int, int] = defaultdict(int)
    for team, gpu_us in recorded:
        totals[team] += gpu_us or 0
    for team, _, _, _, start, end, total_gpus, _ in running:
        for day, gpu_us in day_pieces(start, end, total_gpus, now):
            if day >= since:
                totals[team] += gpu_us
    return totals


def _unrecorded_since(midnight: dt.datetime) -> QuerySet[Attempt]:
    """Attempts not in the records that may have run at or after `midnight`."""
    return Attempt.objects.filter(metered=False, start_time__isnull=False).filter(
        Q(end_time__isnull=True) | Q(end_time__gte=midnight)
    )


def _read_consistently(
    read_records: Callable[[], list], read_unrecorded: Callable[[], list]
) -> tuple[list, list]:
    """The unrecorded attempts (rows of UNRECORDED_COLUMNS), then the records, then a check
    that no such attempt was metered in between (it would be counted twice); read again in that
    rare case."""
    for _ in range(5):
        running = read_unrecorded()
        recorded = read_records()
        ids = [row[0] for row in running]
        if not ids or not Attempt.objects.filter(pk__in=ids, metered=True).exists():
            break
    return recorded, [row[1:] for row in running]


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), dt.UTC)


def usage_activity(
    since: dt.date, until: dt.date, team_ids: list[int], now: dt.datetime
) -> dict[Key, tuple[int, int]]:
    """Active and idle GPU-µs per (day, team, user, cluster, GPU type) in [since, until): the
    usage records' (ended attempts, split over their days) and, on today's key, the running
    attempts' counters so far. Two queries."""
    out: dict[Key, list[int]] = {}
    records = UsageRecord.objects.filter(
        day__gte=since, day__lt=until, team_id__in=team_ids
    ).values_list(*KEY_COLUMNS, "active_gpu_us", "idle_gpu_us")
    for day, team, user, cluster, gpu_type, on, off in records:
        out[(day, team, user, cluster, gpu_type)] = [on, off]
    today = now.astimezone(dt.UTC).date()
    if since <= today < until:
        running = AttemptActivity.objects.filter(
            attempt__metered=False,
            attempt__start_time__isnull=False,
            attempt__job__team_id__in=team_ids,
        ).values_list(
            "attempt__job__team_id", "attempt__job__user_id", "attempt__job__cluster_id",
            "attempt__job__gpu_type", "active_gpu_us", "idle_gpu_us",
        )  # fmt: skip
        for team, user, cluster, gpu_type, on, off in running:
            pair = out.setdefault((today, team, user, cluster, gpu_type), [0, 0])
            pair[0] += on
            pair[1] += off
    return {key: (on, off) for key, (on, off) in out.items()}
