"""Storing the runner's metric batches: `append` checks a batch, keeps out the points already
stored and those past the attempt's cap, and stores the rest with their rollups.

The runner numbers each attempt's points (`seq` from 0) and resends a batch it got no answer
for. A batch is checked in one pass straight into columns (`Batch`, no object per point), then,
under the lock of the attempt's `MetricStream` row that every writer of its points takes first,
the seqs already stored are read (from the chunks whose seq range meets the batch's) and only
the others stored (`jobs.stores.metrics.chunks`) and rolled up
(`jobs.stores.metrics.rollups`). So a resent batch, even one racing its original, is stored and
counted once.

MLflow's points (`append_tracked`, from a job's code through `jobs.api.mlflow`) carry no seq of
their own: they are numbered here, under the same lock, from a range the runner never reaches,
`TRACKING_SEQ_BASE` (2**50) up, the next one after the highest stored there, so they never
collide with the runner's (which `append` keeps below it) and count against the same cap.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from jobs.errors import BadRequest
from jobs.models import BIGINT_MAX, JobEvent, MetricChunk, MetricKind, MetricStream
from jobs.reads.prepared import Prepared
from jobs.stores.metrics.chunks import PACKED, SEQ_COLUMN, chunk, unpack_column, write_chunks
from jobs.stores.metrics.rollups import roll_up

KINDS = tuple(MetricKind.values)
# The client SDK (`sf.metrics.MAX_NAME`) refuses longer names before they are sent: a mirror,
# as the client cannot import the server; tests/client/test_mirrors.py holds them equal.
MAX_NAME = 100
DEFAULT_ATTEMPT_MAX_METRIC_POINTS = 5_000_000
# The runner numbers its points below this; MLflow's points are numbered from it up.
TRACKING_SEQ_BASE = 2**50


@dataclass(frozen=True)
class AppendResult:
    accepted: int
    duplicates: int
    dropped: int = 0  # fresh points past the attempt's cap, not stored


@dataclass
class Batch:
    """A batch's valid points as columns, one per seq (a seq sent twice keeps its last point),
    in seq order: the order they are stored and rolled up in."""

    seq: list[int]
    kind: list[str]
    name: list[str]
    step: list[int]
    value: list[float]
    ts: list[float]

    def __len__(self) -> int:
        return len(self.seq)

    def only(self, keep: Iterable[int]) -> "Batch":
        """The points at the indices `keep`, in their order."""
        rows = list(keep)
        return Batch(*([column[i] for i in rows] for column in self.columns()))

    def columns(self) -> tuple[list, ...]:
        return self.seq, self.kind, self.name, self.step, self.value, self.ts


def max_points() -> int:
    return getattr(settings, "SF_ATTEMPT_MAX_METRIC_POINTS", DEFAULT_ATTEMPT_MAX_METRIC_POINTS)


def append(job_id: int, attempt: int, points: list[Any]) -> AppendResult:
    """Store `points` (dicts with seq, kind, name, step, value, ts), ignoring those already stored.

    An attempt keeps at most SF_ATTEMPT_MAX_METRIC_POINTS points: fresh points past it (the
    highest seqs of the batch first) are dropped, and the first drop writes one NOTE event.
    The attempt's `MetricStream` row, locked first, counts them and orders its batches.
    Raises BadRequest naming the first point that is not valid; nothing is stored then.
    """
    batch = _checked(points)
    if not batch:
        return AppendResult(0, len(points))
    with transaction.atomic():
        counter, stored, dropped = _locked_counter(job_id, attempt)
        fresh = _unstored(job_id, attempt, batch)
        over = _store(job_id, attempt, fresh, (counter, stored, dropped))
    return AppendResult(len(fresh) - over, len(points) - len(fresh), over)


def append_tracked(
    job_id: int, attempt: int, kind: list[str], name: list[str], step: list[int], value, ts
) -> AppendResult:
    """Store MLflow's points, given as checked columns (names 1 to MAX_NAME characters without
    NUL, steps in 0..BIGINT_MAX, finite values and ts in epoch seconds), numbered from the
    attempt's next seq at or above TRACKING_SEQ_BASE. Every point is fresh (MLflow resends
    nothing by seq); past the attempt's cap they are dropped as `append` drops them."""
    if not kind:
        return AppendResult(0, 0)
    with transaction.atomic():
        state = _locked_counter(job_id, attempt)
        first = _next_tracking_seq(job_id, attempt)
        seqs = list(range(first, first + len(kind)))
        batch = Batch(seqs, kind, name, step, [float(v) for v in value], [float(t) for t in ts])
        over = _store(job_id, attempt, batch, state)
    return AppendResult(len(kind) - over, 0, over)


def _store(job_id: int, attempt: int, fresh: Batch, state: tuple[int, int, int]) -> int:
    """Store the fresh points of a batch within the attempt's cap, their rollups and its
    counter, with the counter row (`state`: id, points, dropped) locked; the points dropped."""
    counter, stored, dropped = state
    room = max(0, max_points() - stored)
    over = max(0, len(fresh) - room)
    if over:
        fresh = fresh.only(range(room))
    if fresh:
        _insert(job_id, attempt, fresh)
        roll_up(
            job_id,
            zip(fresh.kind, fresh.name, fresh.step, fresh.ts, fresh.value, strict=True),
        )
    if fresh or over:
        if over and not dropped:
            _cap_event(job_id, attempt)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {MetricStream._meta.db_table} SET points = %s, dropped = %s WHERE id = %s",
                [stored + len(fresh), dropped + over, counter],
            )
    return over


def _next_tracking_seq(job_id: int, attempt: int) -> int:
    """The seq after the attempt's highest one in MLflow's range (exact: the caller holds the
    counter's lock, which every writer of the attempt's points takes first)."""
    rows = LAST_TRACKING_SEQ.rows(job_id=job_id, attempt=attempt, low=TRACKING_SEQ_BASE)
    return rows[0][0] + 1 if rows else TRACKING_SEQ_BASE


# The reads of every batch, their SQL built once per process (`jobs.reads.prepared`).
def _counter_row(shape: tuple, job_id: int, attempt: int) -> Any:
    counters = MetricStream.objects.select_for_update().filter(job_id=job_id, attempt=attempt)
    return counters.values_list("pk", "points", "dropped")


def _meeting_chunks(shape: tuple, job_id: int, attempt: int, low: int, high: int) -> Any:
    # The chunks whose seq range meets [low, high]: for a batch after the last one, none. Ordered
    # by last_seq so that only the (job, attempt, last_seq) index fits the plan: while a job's
    # statistics still say it has no chunks, the series index looks as cheap, and read through
    # it the query would filter every chunk the job has stored, batch after batch.
    return (
        MetricChunk.objects.filter(
            job_id=job_id, attempt=attempt, last_seq__gte=low, first_seq__lte=high
        )
        .order_by("last_seq")
        .values_list(SEQ_COLUMN)
    )


def _last_tracking_seq(shape: tuple, job_id: int, attempt: int, low: int) -> Any:
    # The (job, attempt, last_seq) index read backwards from its end: one probe.
    return (
        MetricChunk.objects.filter(job_id=job_id, attempt=attempt, last_seq__gte=low)
        .order_by("-last_seq")
        .values_list("last_seq")[:1]
    )


COUNTER_ROW = Prepared(_counter_row)
LAST_TRACKING_SEQ = Prepared(_last_tracking_seq)
MEETING_CHUNKS = Prepared(_meeting_chunks)


def _locked_counter(job_id: int, attempt: int) -> tuple[int, int, int]:
    """The id, points and drops of the attempt's counter row, locked; made by the first batch
    (one query after that)."""
    rows = COUNTER_ROW.rows(job_id=job_id, attempt=attempt)
    if not rows:
        MetricStream.objects.get_or_create(job_id=job_id, attempt=attempt)  # two first batches
        rows = COUNTER_ROW.rows(job_id=job_id, attempt=attempt)
    counter, stored, dropped = rows[0]
    return counter, stored, dropped


def hold_writers(job_id: int) -> None:
    """Wait for the job's metric batches in flight and keep new ones out until the caller's
    transaction ends: every writer of a job's points and rollups takes its attempt's counter
    row first (deleting a job takes them before its rollups, which no constraint ties to the
    job, go; `jobs.streamed.MetricRollup.job`)."""
    list(MetricStream.objects.select_for_update().filter(job_id=job_id).values_list("pk"))


def _cap_event(job_id: int, attempt: int) -> None:
    cap = max_points()
    JobEvent.objects.create(
        job_id=job_id,
        kind=JobEvent.Kind.NOTE,
        actor="ingest",
        attempt=attempt,
        reason=(
            f"metric limit of {cap} points reached for attempt {attempt}; "
            "further points are dropped"
        ),
        data={"limit": "metric_points", "max_points": cap},
    )


def _unstored(job_id: int, attempt: int, batch: Batch) -> Batch:
    """The points of `batch` not stored yet: exact, as every writer of the attempt's points
    holds its counter's lock (a resend racing its original waits for it)."""
    chunks = MEETING_CHUNKS.rows(
        job_id=job_id, attempt=attempt, low=batch.seq[0], high=batch.seq[-1]
    )
    if not chunks:
        return batch
    stored: set[int] = set()
    for (seqs,) in chunks:
        stored.update(unpack_column(seqs, PACKED[0]))
    return batch.only(i for i, seq in enumerate(batch.seq) if seq not in stored)


def _insert(job_id: int, attempt: int, batch: Batch) -> None:
    """Store points known to be fresh, one chunk per series."""
    series: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(batch.kind, batch.name, strict=True)):
        rows = series.get(key)
        if rows is None:
            series[key] = [i]
        else:
            rows.append(i)
    parts = [(key, batch if len(series) == 1 else batch.only(rows)) for key, rows in series.items()]
    write_chunks(
        job_id,
        attempt,
        [
            chunk(kind, name, part.seq, part.step, part.value, part.ts)
            for (kind, name), part in parts
        ],
    )


def _checked(points: list[Any]) -> Batch:
    """The valid batch of `points`, or BadRequest naming the first point that is not valid.

    One pass over the points, straight into columns; only a batch with a repeated seq or seqs
    out of order is reordered afterwards.
    """
    batch = Batch([], [], [], [], [], [])
    in_order, last = True, -1
    for i, point in enumerate(points):
        try:
            seq, kind, name, step = point["seq"], point["kind"], point["name"], point["step"]
            value, ts = _finite(point["value"]), _finite(point["ts"])
        except (KeyError, TypeError, ValueError, OverflowError):  # not a dict, or a bad number
            raise _bad_point(i) from None
        if not (
            type(seq) is int
            and 0 <= seq < TRACKING_SEQ_BASE
            and kind in KINDS
            and type(name) is str
            and 0 < len(name) <= MAX_NAME
            and "\x00" not in name  # PostgreSQL text cannot hold NUL
            and type(step) is int
            and 0 <= step <= BIGINT_MAX
        ):
            raise _bad_point(i)
        in_order, last = in_order and seq > last, seq
        batch.seq.append(seq)
        batch.kind.append(kind)
        batch.name.append(name)
        batch.step.append(step)
        batch.value.append(value)
        batch.ts.append(ts)
    if not in_order:  # the last point sent of each seq, in seq order
        index = {seq: i for i, seq in enumerate(batch.seq)}
        batch = batch.only(index[seq] for seq in sorted(index))
    return batch


def _finite(value: object) -> float:
    """`value` as a float; ValueError (or OverflowError) unless it is a finite int or float."""
    if type(value) is float or type(value) is int:  # not bool, whose type is bool
        number = float(value)
        if number - number == 0.0:  # false for NaN and the infinities
            return number
    raise ValueError(value)


def _bad_point(i: int) -> BadRequest:
    return BadRequest(
        f"point {i} must have seq (int >= 0), kind (train|validation|system), name (1 to "
        f"{MAX_NAME} characters, no NUL), step (int >= 0), value and ts (finite numbers); "
        f"seq is below {TRACKING_SEQ_BASE} and step at most {BIGINT_MAX}"
    )
