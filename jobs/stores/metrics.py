"""Metric points logged through the SDK: storing the runner's batches, and reading them for charts.

The runner numbers each attempt's points (`seq` from 0) and resends a batch it got no answer
for. A batch is checked in one pass straight into columns (`Batch`, no object per point), then,
under the lock of the attempt's `MetricStream` row that every writer of its points takes first,
the seqs already stored are read (from the chunks whose seq range meets the batch's) and only
the others stored. So a resent batch, even one racing its original, is stored and counted once.
Points are stored packed: one `MetricChunk` row per series and batch, its points as four binary
columns (`pack`), written with a binary COPY on PostgreSQL and one prepared INSERT on SQLite.
(A row per point cost PostgreSQL half of a batch's ingest: 2,000 rows and two index entries
each, where a packed batch of four series is four rows.) Reads group points into one series per
metric name and downsample each with LTTB, so a chart of a million points stays a few thousand
points on the wire.

Rollups. Reading a million raw points takes a second, so `append` also keeps, per series, a
`MetricSeries` row (count, step and ts extent) and `MetricRollup` buckets: for each axis ("step":
x = step; "time": x = ts in epoch seconds, fixed buckets) and each level k in `LEVELS`, the
points with floor(x / 2**k) == bucket summarised as their count and their first, last, lowest
and highest point. A batch's new points are summarised in memory and merged into the stored rows
by one upsert per table whose ON CONFLICT arithmetic is `merge_stats` / `merge_acc` in SQL:
nothing is read back, and two batches touching the same bucket at once (the row lock of the
upsert orders them, taken in key order) both count. A series of at most `max_points` points
is read raw as before; a longer one from the coarsest level with at least max_points / 3 buckets
in its x range (fewer than 4/3 x max_points buckets, since levels are a factor 4 apart), expanded
to each bucket's first, lowest, highest and last points (three or four distinct ones wherever a
series moves; a finer level is read when they fall short) and reduced with LTTB. Its global lowest
and highest points are kept.

Ties on x: "first" is the earliest-stored point at the lowest x, "last" the latest-stored at the
highest x (the raw order is x, attempt, seq; stored order is seq within a batch, batch arrival
across batches: the same unless an attempt's batches arrive out of order). Rollup x values are
floats: steps beyond 2**53 come back rounded on the rollup path.
"""

import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby, repeat
from math import floor
from operator import itemgetter
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import OuterRef, Q, Subquery
from django.db.models.functions import Length, Substr

from jobs.errors import BadRequest
from jobs.models import (
    JobEvent,
    MetricChunk,
    MetricKind,
    MetricRollup,
    MetricSeries,
    MetricStream,
)
from jobs.reads.prepared import Prepared

KINDS = tuple(MetricKind.values)
MAX_NAME = 100
DEFAULT_MAX_POINTS = 2000
X_FIELDS = {"step": "step", "time": "ts"}
LEVELS = (4, 6, 8, 10, 12, 14, 16)  # bucket widths 16 .. 65,536 steps or seconds
BIGINT_MAX = 2**63 - 1  # seq and step are stored in bigint columns
BUCKET_LIMIT = 2**62  # time buckets of absurd timestamps are clamped to fit a bigint
DEFAULT_ATTEMPT_MAX_METRIC_POINTS = 5_000_000
ROLLUP_FIELDS = (
    "count",
    "first_x",
    "first_y",
    "last_x",
    "last_y",
    "min_x",
    "min_y",
    "max_x",
    "max_y",
)
# A bucket's summary, in ROLLUP_FIELDS order: [count, first_x, first_y, last_x, ..., max_y].
Acc = list[float]
RollupKey = tuple[str, str, str, int, int]  # kind, name, axis, level, bucket


@dataclass(frozen=True)
class AppendResult:
    accepted: int
    duplicates: int
    dropped: int = 0  # fresh points past the attempt's cap, not stored


CHUNK_COLUMNS = "job_id, attempt, kind, name, first_seq, last_seq, max_step, points"
# Their PostgreSQL types, for a binary COPY: no number goes through text on either side.
# `_checked` made seq and step ints in bigint range, value and ts finite floats, kind and name
# strings that fit their varchar columns.
CHUNK_TYPES = ("int8", "int4", "text", "text", "int8", "int8", "int8", "bytea")
# A chunk's columns, in `pack` order: seq and step as int64, value and ts as float64.
PACKED = ("q", "q", "d", "d")
PACKED_BYTES = 8 * len(PACKED)  # per point


def _pick(column: str, test: str) -> str:
    """SET `column` to the batch's value (`excluded`) where `test` holds, else keep the row's."""
    return f"{column} = CASE WHEN {test} THEN excluded.{column} ELSE {{t}}.{column} END"


# ON CONFLICT clauses merging a batch's summary (`excluded`, the later part) into the stored
# row ({t}, the earlier one), as merge_stats and merge_acc do; the SET expressions all read the
# row as it was, so their order does not matter.
SERIES_COLUMNS = (
    ("kind", "text"),
    ("name", "text"),
    ("count", "bigint"),
    ("min_step", "bigint"),
    ("max_step", "bigint"),
    ("min_ts", "float8"),
    ("max_ts", "float8"),
)
SERIES_MERGE = "ON CONFLICT (job_id, kind, name) DO UPDATE SET " + ", ".join(
    [
        "count = {t}.count + excluded.count",
        *(
            _pick(column, f"{{t}}.{column} IS NULL OR excluded.{column} {op} {{t}}.{column}")
            for column, op in (
                ("min_step", "<"),
                ("max_step", ">"),
                ("min_ts", "<"),
                ("max_ts", ">"),
            )
        ),
    ]
).format(t=MetricSeries._meta.db_table)
ROLLUP_COLUMNS = (
    ("kind", "text"),
    ("name", "text"),
    ("axis", "text"),
    ("level", "smallint"),
    ("bucket", "bigint"),
    ("count", "bigint"),
    *((field, "float8") for field in ROLLUP_FIELDS[1:]),
)
ROLLUP_MERGE = "ON CONFLICT (job_id, kind, name, axis, level, bucket) DO UPDATE SET " + ", ".join(
    [
        "count = {t}.count + excluded.count",
        _pick("first_x", "excluded.first_x < {t}.first_x"),
        _pick("first_y", "excluded.first_x < {t}.first_x"),
        _pick("last_x", "excluded.last_x >= {t}.last_x"),
        _pick("last_y", "excluded.last_x >= {t}.last_x"),
        _pick("min_x", "excluded.min_y < {t}.min_y"),
        _pick("min_y", "excluded.min_y < {t}.min_y"),
        _pick("max_x", "excluded.max_y > {t}.max_y"),
        _pick("max_y", "excluded.max_y > {t}.max_y"),
    ]
).format(t=MetricRollup._meta.db_table)


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
        room = max(0, max_points() - stored)
        over = max(0, len(fresh) - room)
        if over:
            fresh = fresh.only(range(room))
        if fresh:
            _insert(job_id, attempt, fresh)
            _roll_up(job_id, fresh)
        if fresh or over:
            if over and not dropped:
                _cap_event(job_id, attempt)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {MetricStream._meta.db_table} SET points = %s, dropped = %s "
                    "WHERE id = %s",
                    [stored + len(fresh), dropped + over, counter],
                )
    return AppendResult(len(fresh), len(points) - len(fresh) - over, over)


# The reads of every batch, their SQL built once per process (`jobs.reads.prepared`).
def _counter_row(shape: tuple, job_id: int, attempt: int) -> Any:
    counters = MetricStream.objects.select_for_update().filter(job_id=job_id, attempt=attempt)
    return counters.values_list("pk", "points", "dropped")


# A chunk's seqs: the first quarter of its points, read without the rest (PostgreSQL slices a
# value stored EXTERNAL, uncompressed, without reading it all).
SEQ_COLUMN = Substr("points", 1, Length("points") / len(PACKED), output_field=models.BinaryField())


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


COUNTER_ROW = Prepared(_counter_row)
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


# A chunk's row: kind, name, first_seq, last_seq, max_step and its packed points.
Chunk = tuple[str, str, int, int, int, bytes]


def chunk(
    kind: str,
    name: str,
    seqs: Sequence[int],
    steps: Sequence[int],
    values: Sequence[float],
    ts: Sequence[float],
) -> Chunk:
    """The chunk of one series' points, given in seq order as columns."""
    return kind, name, seqs[0], seqs[-1], max(steps), pack(seqs, steps, values, ts)


def write_chunks(job_id: int, attempt: int, chunks: Iterable[Chunk]) -> None:
    """Insert chunks of an attempt's points: a binary COPY on PostgreSQL, a prepared INSERT on
    SQLite. The caller has made sure none of their points is stored already."""
    table = MetricChunk._meta.db_table
    rows = [(job_id, attempt, *c) for c in chunks]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            binary = f"COPY {table} ({CHUNK_COLUMNS}) FROM STDIN (FORMAT BINARY)"
            with cursor.cursor.copy(binary) as copy:
                copy.set_types(CHUNK_TYPES)
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ", ".join(["%s"] * 8)
            cursor.executemany(f"INSERT INTO {table} ({CHUNK_COLUMNS}) VALUES ({marks})", rows)


def pack(
    seqs: Sequence[int], steps: Sequence[int], values: Sequence[float], ts: Sequence[float]
) -> bytes:
    """Points as one chunk's bytes: their seqs, steps, values and ts, each a column of
    little-endian 8-byte numbers (`PACKED`)."""
    columns = [
        array(code, column) for code, column in zip(PACKED, (seqs, steps, values, ts), strict=True)
    ]
    if sys.byteorder == "big":
        for column in columns:
            column.byteswap()
    return b"".join(column.tobytes() for column in columns)


def unpack_column(data: bytes | memoryview, code: str) -> array:
    """One packed column, as `pack` wrote it."""
    column = array(code)
    column.frombytes(data)
    if sys.byteorder == "big":
        column.byteswap()
    return column


def unpack(points: bytes | memoryview) -> tuple[array, array, array, array]:
    """A chunk's (seqs, steps, values, ts), as `pack` wrote them."""
    n = len(points) // PACKED_BYTES
    view = memoryview(points)
    seqs, steps, values, ts = (
        unpack_column(view[i * 8 * n : (i + 1) * 8 * n], code) for i, code in enumerate(PACKED)
    )
    return seqs, steps, values, ts


def stored_points(job_id: int) -> list[tuple[int, int, str, str, int, float, float]]:
    """Every stored point of a job as (attempt, seq, kind, name, step, value, ts), in attempt and
    seq order: what the runner's batches added, once each."""
    out: list[tuple[int, int, str, str, int, float, float]] = []
    for attempt, kind, name, points in MetricChunk.objects.filter(job_id=job_id).values_list(
        "attempt", "kind", "name", "points"
    ):
        seqs, steps, values, ts = unpack(points)
        out.extend(zip(repeat(attempt), seqs, repeat(kind), repeat(name), steps, values, ts))
    out.sort(key=lambda point: point[:2])
    return out


def _roll_up(job_id: int, batch: Batch) -> None:
    """Add newly stored points to their MetricSeries and MetricRollup rows.

    One upsert per table whose ON CONFLICT arithmetic merges the batch's summaries into the
    stored rows: no read-modify-write, so a concurrent batch cannot lose an update. The rows
    go in key order, so two batches lock the rows they share in the same order.
    """
    stats, rollups = aggregate(
        zip(batch.kind, batch.name, batch.step, batch.ts, batch.value, strict=True)
    )
    _upsert(
        MetricSeries,
        SERIES_COLUMNS,
        SERIES_MERGE,
        [(*key, *stats[key]) for key in sorted(stats)],
        job_id,
    )
    rows = [(*key, acc[0], *map(float, acc[1:])) for key, acc in sorted(rollups.items())]
    _upsert(MetricRollup, ROLLUP_COLUMNS, ROLLUP_MERGE, rows, job_id)


def _upsert(
    model: Any, columns: tuple[tuple[str, str], ...], merge: str, rows: list[tuple], job_id: int
) -> None:
    """Insert `rows` (values of `columns`, key columns first) of one job, merging conflicts."""
    table = model._meta.db_table
    names = ", ".join(["job_id", *(name for name, _ in columns)])
    head = f"INSERT INTO {table} ({names})"
    if connection.vendor == "postgresql":
        # One array per column, bound on the server in binary: Django's client-side binding
        # would write each of a few thousand numbers into the SQL text and PostgreSQL parse it.
        arrays = ", ".join(f"%b::{kind}[]" for _, kind in columns)
        columns_of_rows = [list(column) for column in zip(*rows, strict=True)]
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(
                f"{head} SELECT %b, * FROM unnest({arrays}) {merge}", [job_id, *columns_of_rows]
            )
        return
    marks = ", ".join(["%s"] * (len(columns) + 1))
    with connection.cursor() as cursor:
        cursor.executemany(f"{head} VALUES ({marks}) {merge}", [(job_id, *row) for row in rows])


def aggregate(
    points: Iterable[tuple[str, str, int, float, float]],
) -> tuple[dict[tuple[str, str], list], dict[RollupKey, Acc]]:
    """Series stats and rollup buckets of (kind, name, step, ts, value) points, in stored order.

    Stats are [count, min_step, max_step, min_ts, max_ts] per (kind, name). Pure: also used by
    the migration that builds the rollups of points stored before them. The finest level is
    built point by point, per series and axis; each coarser one from the level below it.
    """
    stats: dict[tuple[str, str], list] = {}
    finest: dict[tuple[str, str], tuple[dict[int, Acc], dict[int, Acc]]] = {}
    level = LEVELS[0]
    scale = 2.0**-level  # exact: ts * scale == ts / 2**level
    for kind, name, step, ts, value in points:
        # The loop of every stored point, its bucket updates written out inline (calls were a
        # third of its time): first and last by x (the first stored of equal x, the last), the
        # lowest and highest y (the first stored of equal y). Tested against the definitions.
        st = stats.get((kind, name))
        if st is None:
            stats[(kind, name)] = [1, step, step, ts, ts]
            by_step, by_time = finest[(kind, name)] = ({}, {})
        else:
            st[0] += 1
            if step < st[1]:
                st[1] = step
            elif step > st[2]:
                st[2] = step
            if ts < st[3]:
                st[3] = ts
            elif ts > st[4]:
                st[4] = ts
            by_step, by_time = finest[(kind, name)]
        bucket = step >> level
        acc = by_step.get(bucket)
        if acc is None:
            by_step[bucket] = [1, step, value, step, value, step, value, step, value]
        else:
            acc[0] += 1
            if step < acc[1]:
                acc[1], acc[2] = step, value
            if step >= acc[3]:
                acc[3], acc[4] = step, value
            if value < acc[6]:
                acc[5], acc[6] = step, value
            if value > acc[8]:
                acc[7], acc[8] = step, value
        bucket = floor(ts * scale)
        if not -BUCKET_LIMIT <= bucket <= BUCKET_LIMIT:
            bucket = max(-BUCKET_LIMIT, min(BUCKET_LIMIT, bucket))
        acc = by_time.get(bucket)
        if acc is None:
            by_time[bucket] = [1, ts, value, ts, value, ts, value, ts, value]
        else:
            acc[0] += 1
            if ts < acc[1]:
                acc[1], acc[2] = ts, value
            if ts >= acc[3]:
                acc[3], acc[4] = ts, value
            if value < acc[6]:
                acc[5], acc[6] = ts, value
            if value > acc[8]:
                acc[7], acc[8] = ts, value
    rollups: dict[RollupKey, Acc] = {}
    for (kind, name), axes in finest.items():
        for axis, below in zip(("step", "time"), axes, strict=True):
            below_level = level
            rollups.update(((kind, name, axis, level, b), acc) for b, acc in below.items())
            for above_level in LEVELS[1:]:
                shift, above = above_level - below_level, dict[int, Acc]()
                for b in sorted(below):  # x order
                    acc = above.get(b >> shift)
                    above[b >> shift] = list(below[b]) if acc is None else merge_acc(acc, below[b])
                rollups.update(((kind, name, axis, above_level, b), a) for b, a in above.items())
                below, below_level = above, above_level
    return stats, rollups


def bucket_of(x: float, level: int) -> int:
    if isinstance(x, int):
        return x >> level  # steps: exact, floor division
    return max(-BUCKET_LIMIT, min(BUCKET_LIMIT, floor(x / 2**level)))


def merge_acc(earlier: Acc, later: Acc) -> Acc:
    """One bucket's summary from two of its parts, `earlier` the one stored first."""
    out = list(earlier)
    out[0] = earlier[0] + later[0]
    if later[1] < earlier[1]:
        out[1], out[2] = later[1], later[2]
    if later[3] >= earlier[3]:
        out[3], out[4] = later[3], later[4]
    if later[6] < earlier[6]:
        out[5], out[6] = later[5], later[6]
    if later[8] > earlier[8]:
        out[7], out[8] = later[7], later[8]
    return out


def merge_stats(earlier: list, later: list) -> list:
    if not earlier[0]:
        return list(later)
    return [
        earlier[0] + later[0],
        min(earlier[1], later[1]),
        max(earlier[2], later[2]),
        min(earlier[3], later[3]),
        max(earlier[4], later[4]),
    ]


def write_rollups(model: Any, job_id: int, rollups: dict[RollupKey, Acc]) -> None:
    """Upsert rollup buckets (already merged with what is stored) for one job: the migration's
    backfill, which builds each bucket whole."""
    rows = [
        model(
            job_id=job_id,
            kind=kind,
            name=name,
            axis=axis,
            level=level,
            bucket=bucket,
            **dict(zip(ROLLUP_FIELDS, acc, strict=True)),
        )
        for (kind, name, axis, level, bucket), acc in rollups.items()
    ]
    model.objects.bulk_create(
        rows,
        batch_size=1000,
        update_conflicts=True,
        unique_fields=["job", "kind", "name", "axis", "level", "bucket"],
        update_fields=list(ROLLUP_FIELDS),
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
            and 0 <= seq <= BIGINT_MAX
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
        f"seq and step are at most {BIGINT_MAX}"
    )


def series(
    job_id: int, kind: str, x: str = "step", max_points: int = DEFAULT_MAX_POINTS
) -> dict[str, dict]:
    """Every metric of `kind` as {name: {"x", "y", "total", "downsampled"}}, x-ordered.

    `x` is "step" or "time" (epoch seconds). A series longer than `max_points` is reduced to
    exactly `max_points` points with LTTB, keeping its first and last points and its lowest and
    highest values; it is read from the rollups (see the module's docstring), not point by point.
    """
    x_field = X_FIELDS[x]
    raw: list[str] = []
    plans: dict[str, tuple[int, list[int]]] = {}  # name -> (total, levels to try, coarse first)
    for name, total, lo, hi in (
        MetricSeries.objects.filter(job_id=job_id, kind=kind, count__gt=0)
        .order_by("name")
        .values_list("name", "count", f"min_{x_field}", f"max_{x_field}")
    ):
        levels = _levels(lo, hi, total, max_points) if total > max_points else []
        if levels:
            plans[name] = (total, levels)
        else:
            raw.append(name)
    out: dict[str, dict] = {}
    while plans:
        wanted = Q()
        for name, (_, levels) in plans.items():
            wanted |= Q(name=name, level=levels[0])
        rows = (
            MetricRollup.objects.filter(wanted, job_id=job_id, kind=kind, axis=x)
            .order_by("name", "bucket")
            .values_list("name", *ROLLUP_FIELDS[1:])
        )
        retry: dict[str, tuple[int, list[int]]] = {}
        for name, group in groupby(rows, key=itemgetter(0)):
            xs, ys = _expand(group)
            total, levels = plans[name]
            if len(xs) >= max_points:
                out[name] = _downsampled(xs, ys, max_points, total, x == "step")
            elif len(levels) > 1:
                retry[name] = (total, levels[1:])
            else:
                raw.append(name)
        raw += [n for n in plans if n not in out and n not in retry and n not in raw]  # no rows
        plans = retry
    if raw:
        out.update(_raw_series(job_id, kind, x_field, max_points, raw))
    return {name: out[name] for name in sorted(out)}


def _levels(lo: float | None, hi: float | None, total: int, max_points: int) -> list[int]:
    """The rollup levels worth reading for a series, coarsest first; [] means read it raw.

    Starts at the coarsest level with at least max_points / 3 buckets in the x range (each
    bucket gives up to 4 points, 3 or 4 where the series moves); finer ones follow in case the
    buckets turn out too sparse. (At max_points / 2, a chart of four series of 250,000 steps
    read four times the buckets, 15,600 instead of 3,900: most of its time.)
    """
    if lo is None or hi is None:
        return []
    for i in range(len(LEVELS) - 1, -1, -1):
        level = LEVELS[i]
        buckets = min(bucket_of(hi, level) - bucket_of(lo, level) + 1, total)
        if 3 * buckets >= max_points:
            return list(LEVELS[i::-1])
    return []


def _expand(rows: Iterable[tuple]) -> tuple[list[float], list[float]]:
    """Buckets in x order -> their first, lowest, highest and last points, x-ordered, once."""
    xs: list[float] = []
    ys: list[float] = []
    for _, fx, fy, lx, ly, mnx, mny, mxx, mxy in rows:
        # rank: at an equal x the first point goes first and the last point last
        points = sorted({(fx, 0, fy), (mnx, 1, mny), (mxx, 1, mxy), (lx, 2, ly)})
        seen = set()
        for px, _, py in points:
            if (px, py) not in seen:
                seen.add((px, py))
                xs.append(px)
                ys.append(py)
    return xs, ys


def _raw_series(
    job_id: int, kind: str, x_field: str, max_points: int, names: list[str]
) -> dict[str, dict]:
    """The named series read point by point, in x, attempt and seq order, then downsampled."""
    chunks = (
        MetricChunk.objects.filter(job_id=job_id, kind=kind, name__in=names)
        .order_by("name", "attempt", "first_seq")
        .values_list("name", "attempt", "points")
    )
    out = {}
    for name, group in groupby(chunks, key=itemgetter(0)):
        points: list[tuple] = []
        for _, attempt, packed in group:
            seqs, steps, values, ts = unpack(packed)
            xs = steps if x_field == "step" else ts
            points.extend(zip(xs, repeat(attempt), seqs, values))
        points.sort()  # (x, attempt, seq) is unique; nearly sorted already, so about linear
        out[name] = _downsampled(
            [p[0] for p in points], [p[3] for p in points], max_points, len(points), False
        )
    return out


def _downsampled(
    xs: list, ys: list[float], max_points: int, total: int, int_x: bool
) -> dict[str, Any]:
    keep = keep_extremes(lttb(xs, ys, max_points), ys)
    return {
        "x": [int(xs[i]) for i in keep] if int_x else [xs[i] for i in keep],
        "y": [ys[i] for i in keep],
        "total": total,
        "downsampled": len(keep) < total,
    }


def keep_extremes(kept: list[int], ys: Sequence[float]) -> list[int]:
    """`kept` with the lowest and highest of `ys` swapped in for their nearest kept neighbours.

    LTTB keeps spikes in practice but does not promise to; a chart must not lose the worst loss.
    The count and the first and last indices are unchanged.
    """
    if len(kept) < 3 or len(kept) == len(ys):
        return kept
    extremes = {min(range(len(ys)), key=ys.__getitem__), max(range(len(ys)), key=ys.__getitem__)}
    chosen = set(kept)
    for e in sorted(extremes - chosen):
        fixed = {kept[0], kept[-1]} | extremes
        candidates = [i for i in chosen if i not in fixed]
        if not candidates:
            break
        chosen.remove(min(candidates, key=lambda i: abs(i - e)))
        chosen.add(e)
    return sorted(chosen)


def latest(job_id: int, kind: str) -> dict[str, dict]:
    """Each metric's point at its highest step (the last logged of those) as {name: {...}}.

    One index probe per metric: the chunks holding its highest step (`MetricSeries.max_step`).
    """
    return latest_of([job_id], kind).get(job_id, {})


def latest_of(job_ids: list[int], kind: str) -> dict[int, dict[str, dict]]:
    """`latest` of several jobs (an array's tasks) in one query."""
    highest = MetricSeries.objects.filter(
        job_id=OuterRef("job_id"), kind=OuterRef("kind"), name=OuterRef("name")
    ).values("max_step")
    chunks = MetricChunk.objects.filter(
        job_id__in=job_ids, kind=kind, max_step=Subquery(highest)
    ).values_list("job_id", "name", "attempt", "max_step", "points")
    best: dict[tuple[int, str], tuple] = {}
    for job_id, name, attempt, step, packed in chunks:
        seqs, steps, values, ts = unpack(packed)
        # Seqs rise within a chunk: its last point at the highest step is the one logged last.
        i = len(steps) - 1 - steps[::-1].index(step)
        point = (step, attempt, seqs[i], values[i], ts[i])
        if (job_id, name) not in best or point > best[(job_id, name)]:
            best[(job_id, name)] = point
    found: dict[int, dict[str, dict]] = {}
    for (job_id, name), (step, _, _, value, ts) in sorted(best.items()):
        found.setdefault(job_id, {})[name] = {"step": step, "value": value, "ts": ts}
    return found


def lttb(xs: Sequence[float], ys: Sequence[float], threshold: int) -> list[int]:
    """Indices of the points Largest-Triangle-Three-Buckets keeps (Steinarsson, 2013).

    The first and last points are always kept; the n - 2 points between them are cut into
    `threshold` - 2 buckets, and from each bucket the point forming the largest triangle with
    the point kept before it and the average of the next bucket is kept. With n <= threshold
    every index comes back; otherwise exactly `threshold` of them, in order.
    """
    n = len(xs)
    if n <= threshold:
        return list(range(n))
    if threshold < 3:
        return [0, n - 1][:threshold]
    buckets = threshold - 2

    def edge(bucket: int) -> int:  # integer arithmetic: no float rounding at the last edge
        return bucket * (n - 2) // buckets + 1

    kept = [0]
    a = 0
    for bucket in range(buckets):
        start, end = edge(bucket), edge(bucket + 1)
        next_end = min(edge(bucket + 2), n)
        span = next_end - end
        avg_x = sum(xs[end:next_end]) / span
        avg_y = sum(ys[end:next_end]) / span
        ax, ay = xs[a], ys[a]
        dx, dy = ax - avg_x, avg_y - ay
        best, best_area = start, -1.0
        for i in range(start, end):
            # Twice the triangle's area; the constant factor does not change the winner.
            area = abs(dx * (ys[i] - ay) - (ax - xs[i]) * dy)
            if area > best_area:
                best, best_area = i, area
        kept.append(best)
        a = best
    kept.append(n - 1)
    return kept
