"""Metric rollups: per series, a `MetricSeries` row (count, step and ts extent) and
`MetricRollup` buckets, kept as points are stored so that a chart of a long series reads
buckets, not a million raw points (a second's work).

For each axis ("step": x = step; "time": x = ts in epoch seconds, fixed buckets) and each level
k in `LEVELS`, the points with floor(x / 2**k) == bucket are summarised as their count and
their first, last, lowest and highest point. A batch's new points are summarised in memory
(`aggregate`) and merged into the stored rows by one upsert per table whose ON CONFLICT
arithmetic is `merge_stats` / `merge_acc` in SQL: nothing is read back, and two batches
touching the same bucket at once (the row lock of the upsert orders them, taken in key order)
both count.

Ties on x: "first" is the earliest-stored point at the lowest x, "last" the latest-stored at the
highest x (the raw order is x, attempt, seq; stored order is seq within a batch, batch arrival
across batches: the same unless an attempt's batches arrive out of order). Rollup x values are
floats: steps beyond 2**53 come back rounded on the rollup path.
"""

from collections.abc import Iterable
from math import floor
from typing import Any

import psycopg
from django.db import connection

from jobs.models import MetricRollup, MetricSeries

LEVELS = (4, 6, 8, 10, 12, 14, 16)  # bucket widths 16 .. 65,536 steps or seconds
BUCKET_LIMIT = 2**62  # time buckets of absurd timestamps are clamped to fit a bigint
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


def roll_up(job_id: int, points: Iterable[tuple[str, str, int, float, float]]) -> None:
    """Add newly stored (kind, name, step, ts, value) points, in stored order, to their
    MetricSeries and MetricRollup rows.

    An upsert per table whose ON CONFLICT arithmetic merges the batch's summaries into the
    stored rows: no read-modify-write, so a concurrent batch cannot lose an update. The rows
    go in key order, so two batches lock the rows they share in the same order.
    """
    stats, rollups = aggregate(points)
    series = [(*key, *stats[key]) for key in sorted(stats)]
    rows = [(*key, acc[0], *map(float, acc[1:])) for key, acc in sorted(rollups.items())]
    if connection.vendor == "postgresql":
        # Both upserts in one statement (one round trip; every batch's the same statement, so
        # two batches take the rows' locks in the same order), each table's columns as arrays
        # bound on the server in binary: Django's client-side binding would write each of a
        # few thousand numbers into the SQL text and PostgreSQL parse it.
        sql_series, args_series = _unnest(MetricSeries, SERIES_COLUMNS, SERIES_MERGE, series)
        sql_rollups, args_rollups = _unnest(MetricRollup, ROLLUP_COLUMNS, ROLLUP_MERGE, rows)
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(
                f"WITH series AS ({sql_series}) {sql_rollups}",
                [job_id, *args_series, job_id, *args_rollups],
            )
        return
    _insert_many(MetricSeries, SERIES_COLUMNS, SERIES_MERGE, series, job_id)
    _insert_many(MetricRollup, ROLLUP_COLUMNS, ROLLUP_MERGE, rows, job_id)


def _head(model: Any, columns: tuple[tuple[str, str], ...]) -> str:
    names = ", ".join(["job_id", *(name for name, _ in columns)])
    return f"INSERT INTO {model._meta.db_table} ({names})"


def _unnest(
    model: Any, columns: tuple[tuple[str, str], ...], merge: str, rows: list[tuple]
) -> tuple[str, list]:
    """PostgreSQL: an upsert of `rows` (values of `columns`, key columns first) of one job
    (its first parameter), one array per column, and its parameters after the job's."""
    arrays = ", ".join(f"%b::{kind}[]" for _, kind in columns)
    columns_of_rows = [list(column) for column in zip(*rows, strict=True)]
    return f"{_head(model, columns)} SELECT %b, * FROM unnest({arrays}) {merge}", columns_of_rows


def _insert_many(
    model: Any, columns: tuple[tuple[str, str], ...], merge: str, rows: list[tuple], job_id: int
) -> None:
    """SQLite: insert `rows` (values of `columns`, key columns first) of one job, merging."""
    marks = ", ".join(["%s"] * (len(columns) + 1))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"{_head(model, columns)} VALUES ({marks}) {merge}", [(job_id, *row) for row in rows]
        )


# Over the complexity limits on purpose: the loop over every stored point has its bucket updates
# written out inline (calls were a third of its time; bench: metrics ingest), and is tested
# against the definitions (tests/stores/test_metrics.py).
def aggregate(  # noqa: C901, PLR0912, PLR0915
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
