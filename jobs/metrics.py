"""Metric points logged through the SDK: storing the runner's batches, and reading them for charts.

The runner numbers each attempt's points (`seq` from 0); the unique (job, attempt, seq) constraint
makes a resent batch a no-op, so ingest needs no lock and no ordering between batches. Reads
group points into one series per metric name and downsample each with LTTB, so a chart of a
million points stays a few thousand points on the wire.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from math import isfinite
from operator import itemgetter
from typing import Any

from django.db import connection, transaction

from jobs.errors import BadRequest
from jobs.models import MetricPoint

KINDS = tuple(MetricPoint.Kind.values)
MAX_NAME = 100
DEFAULT_MAX_POINTS = 2000
X_FIELDS = {"step": "step", "time": "ts"}


@dataclass(frozen=True)
class AppendResult:
    accepted: int
    duplicates: int


def append(job_id: int, attempt: int, points: list[Any]) -> AppendResult:
    """Store `points` (dicts with seq, kind, name, step, value, ts), ignoring those already stored.

    Raises BadRequest naming the first point that is not valid; nothing is stored then.
    """
    by_seq = {point["seq"]: point for point in _checked(points)}  # a repeat inside the batch
    if not by_seq:
        return AppendResult(0, len(points))
    with transaction.atomic():
        stored = set(
            MetricPoint.objects.filter(
                job_id=job_id, attempt=attempt, seq__range=(min(by_seq), max(by_seq))
            ).values_list("seq", flat=True)
        )
        fresh = [
            MetricPoint(job_id=job_id, attempt=attempt, **_fields(point))
            for seq, point in by_seq.items()
            if seq not in stored
        ]
        # ignore_conflicts covers a concurrent resend of the same batch between read and write.
        MetricPoint.objects.bulk_create(fresh, batch_size=5000, ignore_conflicts=True)
    return AppendResult(len(fresh), len(points) - len(fresh))


def _checked(points: list[Any]) -> list[dict]:
    for i, point in enumerate(points):
        if not (
            isinstance(point, dict)
            and type(point.get("seq")) is int
            and point["seq"] >= 0
            and point.get("kind") in KINDS
            and isinstance(point.get("name"), str)
            and 0 < len(point["name"]) <= MAX_NAME
            and type(point.get("step")) is int
            and 0 <= point["step"] < 2**63
            and _finite(point.get("value"))
            and _finite(point.get("ts"))
        ):
            raise BadRequest(
                f"point {i} must have seq (int >= 0), kind (train|validation|system), name (1 to "
                f"{MAX_NAME} characters), step (int >= 0), value and ts (finite numbers)"
            )
    return points


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and isfinite(value)


def _fields(point: dict) -> dict:
    return {
        "seq": point["seq"],
        "kind": point["kind"],
        "name": point["name"],
        "step": point["step"],
        "value": float(point["value"]),
        "ts": float(point["ts"]),
    }


def series(
    job_id: int, kind: str, x: str = "step", max_points: int = DEFAULT_MAX_POINTS
) -> dict[str, dict]:
    """Every metric of `kind` as {name: {"x", "y", "total", "downsampled"}}, x-ordered.

    `x` is "step" or "time" (epoch seconds). A series longer than `max_points` is reduced to
    exactly `max_points` points with LTTB, keeping its first and last points.
    """
    x_field = X_FIELDS[x]
    rows = (
        MetricPoint.objects.filter(job_id=job_id, kind=kind)
        .order_by("name", x_field, "attempt", "seq")
        .values_list("name", x_field, "value")
    )
    out = {}
    for name, group in groupby(rows, key=itemgetter(0)):
        points = list(group)
        xs = [p[1] for p in points]
        ys = [p[2] for p in points]
        keep = lttb(xs, ys, max_points)
        out[name] = {
            "x": [xs[i] for i in keep],
            "y": [ys[i] for i in keep],
            "total": len(points),
            "downsampled": len(keep) < len(points),
        }
    return out


def latest(job_id: int, kind: str) -> dict[str, dict]:
    """Each metric's point at its highest step (the last logged of those) as {name: {...}}."""
    points = MetricPoint.objects.filter(job_id=job_id, kind=kind)
    out = {}
    for name in _names(job_id, kind):
        # One index probe per metric on (job, kind, name, step): no scan of the whole series.
        step, value, ts = (
            points.filter(name=name)
            .order_by("-step", "-attempt", "-seq")
            .values_list("step", "value", "ts")[0]
        )
        out[name] = {"step": step, "value": value, "ts": ts}
    return out


def _names(job_id: int, kind: str) -> list[str]:
    """The metric names of one job and kind, by skipping through the series index.

    A plain DISTINCT reads every index entry (150 ms at a million points); this recursive
    query makes one index probe per name instead, on PostgreSQL and SQLite alike.
    """
    table = MetricPoint._meta.db_table
    where = "job_id = %s AND kind = %s"
    sql = f"""
        WITH RECURSIVE names(name) AS (
            SELECT MIN(name) FROM {table} WHERE {where}
            UNION ALL
            SELECT (SELECT MIN(name) FROM {table} WHERE {where} AND name > names.name)
            FROM names WHERE names.name IS NOT NULL
        )
        SELECT name FROM names WHERE name IS NOT NULL
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [job_id, kind, job_id, kind])
        return [row[0] for row in cursor.fetchall()]


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
