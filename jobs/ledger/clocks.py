"""Owns the attempt clocks: opening an attempt, marking it started, seeing it alive, closing it.

Metering bills (end − start) × GPUs per attempt (docs/ARCHITECTURE.md, invariant 5), so these two
times are the bill, and nothing a job's code writes may set them on its own (invariant 7).
Only this module writes `Attempt.start_time` and `Attempt.end_time` (a test reads the source of
every other module to prove it); the loops (scheduler, launcher, reconciler), the control verbs
and the runner's ingest endpoint call it.

The rules every write follows:
- A start comes from the server's clock (the runner's start report, the reconciler's first
  sight of the attempt running) or the engine's own record of it, and lies between the
  attempt's admission and now: a start read as earlier would bill queued time, a later one is
  a clock from the future.
- An end is never before the last moment the server saw the attempt alive (`alive_at`: a log
  line, metric point or start report it accepted, or the engine reporting it running), never
  before its start, and never after now.
- Each clock is written once: the writes are guarded updates (`WHERE start_time IS NULL`,
  `WHERE end_time IS NULL`), so an end observed twice is closed once.
"""

import datetime as dt
from collections.abc import Iterable

from django.db.models import Q, QuerySet

from jobs.models import Attempt

# Seeing an attempt alive costs an UPDATE; one per attempt per this many seconds is enough to
# bound an end (the reconciler's own sightings come every tick anyway).
ALIVE_RESOLUTION = dt.timedelta(seconds=1)


def open_attempts(rows: list[Attempt], now: dt.datetime) -> list[Attempt]:
    """Create the attempts the scheduler admitted, each opened (submitted) at `now`."""
    for row in rows:
        row.submitted_at = now
    return Attempt.objects.bulk_create(rows, batch_size=1000)


def bounded_start(attempt: Attempt, reported: dt.datetime | None, now: dt.datetime):
    """`reported` (an engine's start) within [admission, now], or None when none was reported."""
    if reported is None:
        return None
    return min(max(reported, attempt.submitted_at), now)


def mark_started(attempt: Attempt, at: dt.datetime, now: dt.datetime, *, reopen: bool = False):
    """Set the attempt's start once, bounded by its admission and now; return the stored start.

    With `reopen`, a start learnt after the attempt was closed (a stop racing the engine's
    start) is still taken, and the attempt is metered again to add exactly its time.
    """
    start = bounded_start(attempt, at, now)
    rows = Attempt.objects.filter(pk=attempt.pk, start_time__isnull=True)
    if reopen:
        rows.filter(end_time__gt=start).update(start_time=start, metered=False)
    else:
        rows.filter(end_time__isnull=True).update(start_time=start)
    attempt.start_time = Attempt.objects.values_list("start_time", flat=True).get(pk=attempt.pk)
    return attempt.start_time


def mark_started_many(attempts: list[Attempt], reported: dict[int, dt.datetime], now: dt.datetime):
    """`mark_started` for each of `attempts` (none reopened), in two statements for them all:
    each start bounded as there and set where none is yet, then each stored start read back."""
    wanted = [attempt for attempt in attempts if reported.get(attempt.pk) is not None]
    for attempt in wanted:
        attempt.start_time = bounded_start(attempt, reported[attempt.pk], now)
    pks = [attempt.pk for attempt in wanted]
    Attempt.objects.filter(pk__in=pks, start_time__isnull=True, end_time__isnull=True).bulk_update(
        wanted, ["start_time"]
    )
    _read_clocks(attempts)


def close_many(
    attempts: list[Attempt],
    reported_ends: dict[int, dt.datetime | None],
    now: dt.datetime,
    exit_codes: dict[int, int | None],
    **fields,
) -> int:
    """`close` for each of `attempts`, in two statements for them all: each end bounded as
    `bounded_end` says, each attempt's exit code and the shared `fields` (end_reason, failure)
    written where it is still open. Returns how many it closed: fewer than `attempts` when one
    was closed meanwhile, which the caller must not take as closed (it rolls back)."""
    _read_clocks(attempts)
    for attempt in attempts:
        attempt.end_time = bounded_end(attempt, reported_ends.get(attempt.pk), now)
        attempt.exit_code = exit_codes.get(attempt.pk)
        for name, value in fields.items():
            setattr(attempt, name, value)
    rows = Attempt.objects.filter(
        pk__in=[attempt.pk for attempt in attempts], end_time__isnull=True
    )
    return rows.bulk_update(attempts, ["end_time", "exit_code", *fields])


def _read_clocks(attempts: list[Attempt]) -> None:
    """Each attempt's clocks as stored, in one statement."""
    columns = ("start_time", "alive_at", "submitted_at", "end_time")
    stored = Attempt.objects.filter(pk__in=[attempt.pk for attempt in attempts])
    by_pk = {row[0]: row[1:] for row in stored.values_list("pk", *columns)}
    for attempt in attempts:
        for name, value in zip(columns, by_pk[attempt.pk], strict=True):
            setattr(attempt, name, value)


def seen_alive(attempt_ids: Iterable[int], now: dt.datetime) -> None:
    """The server saw these attempts alive at `now`: no end may be billed before it."""
    ids = list(attempt_ids)
    if not ids:
        return
    Attempt.objects.filter(pk__in=ids, end_time__isnull=True).filter(
        Q(alive_at__isnull=True) | Q(alive_at__lt=now - ALIVE_RESOLUTION)
    ).update(alive_at=now)


def bounded_end(attempt: Attempt, reported: dt.datetime | None, now: dt.datetime) -> dt.datetime:
    """`reported` (an engine's or the runner's end) no earlier than the start and the last
    sighting alive, and no later than now; now when nothing was reported."""
    floors = [t for t in (attempt.alive_at, attempt.start_time) if t is not None]
    return max([min(reported or now, now), *floors])


def close(attempt: Attempt, reported_end: dt.datetime | None, now: dt.datetime, **fields) -> bool:
    """Close the attempt once, with `fields` (exit_code, end_reason, failure); True when this
    call closed it. The end is bounded as `bounded_end` says."""
    current = (
        Attempt.objects.filter(pk=attempt.pk).values("start_time", "alive_at", "submitted_at").get()
    )
    for name, value in current.items():
        setattr(attempt, name, value)
    end = bounded_end(attempt, reported_end, now)
    closed = Attempt.objects.filter(pk=attempt.pk, end_time__isnull=True).update(
        end_time=end, **fields
    )
    if closed:
        attempt.end_time = end
    return bool(closed)


def close_open(attempt_ids: Iterable[int] | QuerySet, now: dt.datetime, reason: str) -> int:
    """Close these attempts at `now` where still open (a stop, a pause, a failed launch): the
    server's own decision, so its clock is the end. `attempt_ids` may be a subquery, so the
    close is one statement. Returns how many it closed."""
    return Attempt.objects.filter(pk__in=attempt_ids, end_time__isnull=True).update(
        end_time=now, end_reason=reason
    )
