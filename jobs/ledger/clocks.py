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
- Never bill more than the engine (issue 50): where the engine reports its own start and end
  (Slurm's Start/End, a pod's container run, Ray's job times), they are kept on the attempt
  (`engine_start`, `engine_end`) and bound the bill. The billed end is the earlier of the
  reported end (the runner's signed exit) and the engine's, bounded below by the last
  sighting alive; the engine's end caps even that, since the engine, not the job, wrote it.
  Where the engine's start is when the attempt's run began (Slurm's Start, a single pod's
  container start), the billed start is the engine's start (never before the admission): the
  allocation held the GPUs from then, the runner reports its start only after its own
  startup, and an engine that keeps whole seconds (Slurm, Kubernetes) bills from that second
  too. Where the engine's start comes earlier than the run (Ray's start_time is the
  submission, before Ray's own queue; a gang's earliest rank, up while the others waited:
  `EngineTimes.start_bills` False), the billed start stays the attempt's own, never before
  the engine's (invariant 5: queued time is never billed). That start is the one
  change to a written clock, made once in the close that learns the engine's times. A stop
  or a pause is the server's decision, closed at its clock; the engine's end of it, learnt
  later, brings the end back within the engine's while the attempt is not metered yet, and
  metering waits for it: an ended attempt on an engine whose end is not known yet, or billed
  past it, is metered once the engine's end bounds it, or ENGINE_END_GRACE after its end when
  the engine does not say (`metering.records.awaiting_engine`).
"""

import datetime as dt
from collections.abc import Iterable
from typing import NamedTuple

from django.db.models import Q, QuerySet

from jobs.models import Attempt

# Seeing an attempt alive costs an UPDATE; one per attempt per this many seconds is enough to
# bound an end (the reconciler's own sightings come every tick anyway).
ALIVE_RESOLUTION = dt.timedelta(seconds=1)
# What a close writes besides the end: the start (bounded by the engine's) and the engine's times.
ENGINE_FIELDS = ("start_time", "engine_start", "engine_end")


class EngineTimes(NamedTuple):
    """The engine's own start and end of an attempt, where it reported them (None: not yet),
    and whether the bill starts at that start (see the module's docstring)."""

    start: dt.datetime | None = None
    end: dt.datetime | None = None
    start_bills: bool = True


NOT_REPORTED = EngineTimes()  # the engine said nothing of its own times


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
    engine: dict[int, EngineTimes] | None = None,
    **fields,
) -> int:
    """`close` for each of `attempts`, in two statements for them all: each end bounded as
    `bounded_end` says, each attempt's exit code and the shared `fields` (end_reason, failure)
    written where it is still open. Returns how many it closed: fewer than `attempts` when one
    was closed meanwhile, which the caller must not take as closed (it rolls back). `engine`:
    each attempt's engine times where the engine reported them."""
    _read_clocks(attempts)
    engine = engine or {}
    for attempt in attempts:
        _engine_bounds(attempt, engine.get(attempt.pk, NOT_REPORTED))
        attempt.end_time = bounded_end(attempt, reported_ends.get(attempt.pk), now)
        attempt.exit_code = exit_codes.get(attempt.pk)
        for name, value in fields.items():
            setattr(attempt, name, value)
    rows = Attempt.objects.filter(
        pk__in=[attempt.pk for attempt in attempts], end_time__isnull=True
    )
    return rows.bulk_update(attempts, [*ENGINE_FIELDS, "end_time", "exit_code", *fields])


def _read_clocks(attempts: list[Attempt]) -> None:
    """Each attempt's clocks as stored, in one statement."""
    columns = ("start_time", "alive_at", "submitted_at", "end_time", *ENGINE_FIELDS[1:])
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
    sighting alive, and no later than now; now when nothing was reported. Where the attempt
    holds the engine's end, never after it either (nor before the start)."""
    floors = [t for t in (attempt.alive_at, attempt.start_time) if t is not None]
    end = max([min(reported or now, now), *floors])
    if attempt.engine_end is not None:
        end = min(end, max(attempt.engine_end, attempt.start_time or attempt.engine_end))
    return end


def engine_start_bound(
    start: dt.datetime | None, engine_start: dt.datetime | None, start_bills: bool = True
):
    """The billed start given the engine's: the engine's own start, where the attempt ran
    (see the module's docstring); where the engine's start is earlier than the run
    (`start_bills` False), `start`, never before the engine's."""
    if start is None or engine_start is None:
        return start
    return engine_start if start_bills else max(start, engine_start)


def _engine_bounds(attempt: Attempt, engine: EngineTimes) -> None:
    """Take the engine's times onto `attempt` (in memory) as the engine gave them, and bound
    its start by them (`bounded_start` already keeps it after the admission)."""
    if engine.start is not None:
        attempt.engine_start = engine.start
    if engine.end is not None:
        attempt.engine_end = max(engine.end, attempt.engine_start or engine.end)
    if attempt.engine_start is not None and attempt.start_time is not None:
        bound = engine_start_bound(attempt.start_time, attempt.engine_start, engine.start_bills)
        attempt.start_time = max(bound, attempt.submitted_at)


def close(
    attempt: Attempt,
    reported_end: dt.datetime | None,
    now: dt.datetime,
    engine: EngineTimes = NOT_REPORTED,
    **fields,
) -> bool:
    """Close the attempt once, with `fields` (exit_code, end_reason, failure); True when this
    call closed it. `engine`: the engine's own times, where it reported them. The end is
    bounded as `bounded_end` says, the start as `engine_start_bound`."""
    _read_clocks([attempt])
    _engine_bounds(attempt, engine)
    end = bounded_end(attempt, reported_end, now)
    # A start still unknown is not written: the runner's report may set it meanwhile.
    written = ENGINE_FIELDS if attempt.start_time is not None else ENGINE_FIELDS[1:]
    clocks = {name: getattr(attempt, name) for name in written}
    closed = Attempt.objects.filter(pk=attempt.pk, end_time__isnull=True).update(
        end_time=end, **clocks, **fields
    )
    if closed:
        attempt.end_time = end
    return bool(closed)


def engine_record(attempt: Attempt, engine: EngineTimes) -> None:
    """The engine's times of an attempt closed before the engine said them all (a stop, a
    pause: the server closed it at its own clock, then cancelled; a gang whose other ranks
    were still being killed), learnt once the engine ended it: kept beside the billed ones,
    once, and while the attempt is not metered yet, its start bounded as `engine_start_bound`
    says and its end brought back within the engine's (the job may have ended on the engine
    just before the stop). A metered attempt keeps its bill."""
    if engine.end is None or attempt.engine_end is not None:
        return  # the engine has not ended it yet, or its times are kept already
    _read_clocks([attempt])
    if attempt.engine_end is not None or attempt.end_time is None:
        return  # known already, or still open: its close takes them
    _engine_bounds(attempt, engine)
    rows = Attempt.objects.filter(pk=attempt.pk, engine_end__isnull=True)
    if not rows.update(engine_start=attempt.engine_start, engine_end=attempt.engine_end):
        return
    if attempt.start_time is None or attempt.engine_end is None:
        return  # it never started: nothing billed, nothing to bound
    end = max(min(attempt.end_time, attempt.engine_end), attempt.start_time)
    Attempt.objects.filter(pk=attempt.pk, metered=False).update(
        start_time=attempt.start_time, end_time=end
    )


def close_open(attempt_ids: Iterable[int] | QuerySet, now: dt.datetime, reason: str) -> int:
    """Close these attempts at `now` where still open (a stop, a pause, a failed launch): the
    server's own decision, so its clock is the end. `attempt_ids` may be a subquery, so the
    close is one statement. Returns how many it closed."""
    return Attempt.objects.filter(pk__in=attempt_ids, end_time__isnull=True).update(
        end_time=now, end_reason=reason
    )
