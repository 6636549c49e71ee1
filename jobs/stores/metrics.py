"""Metric points logged through the SDK: storing the runner's batches, and reading them for charts.

The runner numbers each attempt's points (`seq` from 0); the unique (job, attempt, seq) constraint
makes a resent batch a no-op. Reads group points into one series per metric name and downsample
each with LTTB, so a chart of a million points stays a few thousand points on the wire.

Rollups. Reading a million raw points takes a second, so `append` also keeps, per series, a
`MetricSeries` row (count, step and ts extent) and `MetricRollup` buckets: for each axis ("step":
x = step; "time": x = ts in epoch seconds, fixed buckets) and each level k in `LEVELS`, the
points with floor(x / 2**k) == bucket summarised as their count and their first, last, lowest
and highest point. Only the points the INSERT really stored (`RETURNING seq`) are rolled up, so
a resent batch, even one racing its original, is counted once. The merge of a batch into the
stored buckets is read-modify-write, ordered by the row locks of the series touched (taken in
(kind, name) order, after the points are inserted, so no lock is held while waiting on a
conflicting insert). A series of at most `max_points` points is read raw as before; a longer one
from the coarsest level with at least max_points / 2 buckets in its x range (fewer than 2 x
max_points buckets, since levels are a factor 4 apart), expanded to each bucket's first, lowest,
highest and last points and reduced with LTTB. Its global lowest and highest points are kept.

Ties on x: "first" is the earliest-stored point at the lowest x, "last" the latest-stored at the
highest x (the raw order is x, attempt, seq; stored order is seq within a batch, batch arrival
across batches: the same unless an attempt's batches arrive out of order). Rollup x values are
floats: steps beyond 2**53 come back rounded on the rollup path.
"""

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from math import floor, isfinite
from operator import itemgetter
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q

from jobs.errors import BadRequest
from jobs.models import JobEvent, MetricPoint, MetricRollup, MetricSeries, MetricStream

KINDS = tuple(MetricPoint.Kind.values)
MAX_NAME = 100
DEFAULT_MAX_POINTS = 2000
X_FIELDS = {"step": "step", "time": "ts"}
LEVELS = (4, 6, 8, 10, 12, 14, 16)  # bucket widths 16 .. 65,536 steps or seconds
BIGINT_MAX = 2**63 - 1  # seq and step are stored in bigint columns
BUCKET_LIMIT = 2**62  # time buckets of absurd timestamps are clamped to fit a bigint
DEFAULT_ATTEMPT_MAX_METRIC_POINTS = 5_000_000
INSERT_CHUNK = 1000  # rows per INSERT: 8,000 parameters, under SQLite's limit
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


def max_points() -> int:
    return getattr(settings, "SF_ATTEMPT_MAX_METRIC_POINTS", DEFAULT_ATTEMPT_MAX_METRIC_POINTS)


def append(job_id: int, attempt: int, points: list[Any]) -> AppendResult:
    """Store `points` (dicts with seq, kind, name, step, value, ts), ignoring those already stored.

    An attempt keeps at most SF_ATTEMPT_MAX_METRIC_POINTS points: fresh points past it (the
    highest seqs of the batch first) are dropped, and the first drop writes one NOTE event.
    The attempt's `MetricStream` row, locked first, counts them: two queries per batch.
    Raises BadRequest naming the first point that is not valid; nothing is stored then.
    """
    by_seq = {point["seq"]: point for point in _checked(points)}  # a repeat inside the batch
    if not by_seq:
        return AppendResult(0, len(points))
    with transaction.atomic():
        counter = _locked_counter(job_id, attempt)
        stored = set(
            MetricPoint.objects.filter(
                job_id=job_id, attempt=attempt, seq__range=(min(by_seq), max(by_seq))
            ).values_list("seq", flat=True)
        )
        fresh = [_fields(by_seq[seq]) for seq in sorted(by_seq) if seq not in stored]
        room = max(0, max_points() - counter.points)
        fresh, over = fresh[:room], fresh[room:]
        # ON CONFLICT DO NOTHING covers a concurrent resend between the read and the write;
        # RETURNING says which rows this transaction stored, and only those are rolled up.
        inserted = _insert(job_id, attempt, fresh)
        new = [point for point in fresh if point["seq"] in inserted]
        if new:
            _roll_up(job_id, new)
        if new or over:
            if over and not counter.dropped:
                _cap_event(job_id, attempt)
            MetricStream.objects.filter(pk=counter.pk).update(
                points=counter.points + len(new), dropped=counter.dropped + len(over)
            )
    return AppendResult(len(new), len(points) - len(new) - len(over), len(over))


def _locked_counter(job_id: int, attempt: int) -> MetricStream:
    """The attempt's counter row, locked; made by the first batch (one query after that)."""
    locked = MetricStream.objects.select_for_update()
    counter = locked.filter(job_id=job_id, attempt=attempt).first()
    if counter is None:
        MetricStream.objects.get_or_create(job_id=job_id, attempt=attempt)  # two first batches
        counter = locked.get(job_id=job_id, attempt=attempt)
    return counter


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


def _insert(job_id: int, attempt: int, points: list[dict]) -> set[int]:
    table = MetricPoint._meta.db_table
    inserted: set[int] = set()
    with connection.cursor() as cursor:
        for start in range(0, len(points), INSERT_CHUNK):
            chunk = points[start : start + INSERT_CHUNK]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            params: list = []
            for p in chunk:
                params += [job_id, attempt, p["seq"], p["kind"], p["name"], p["step"]]
                params += [p["value"], p["ts"]]
            cursor.execute(
                f"INSERT INTO {table} (job_id, attempt, seq, kind, name, step, value, ts) "
                f"VALUES {values} ON CONFLICT (job_id, attempt, seq) DO NOTHING RETURNING seq",
                params,
            )
            inserted.update(row[0] for row in cursor.fetchall())
    return inserted


def _roll_up(job_id: int, points: list[dict]) -> None:
    """Add newly stored points (in stored order) to their MetricSeries and MetricRollup rows."""
    stats, rollups = aggregate(
        (p["kind"], p["name"], p["step"], p["ts"], p["value"]) for p in points
    )
    MetricSeries.objects.bulk_create(
        [MetricSeries(job_id=job_id, kind=kind, name=name) for kind, name in stats],
        ignore_conflicts=True,
    )
    wanted = Q()
    for kind, name in stats:
        wanted |= Q(kind=kind, name=name)
    locked = (
        MetricSeries.objects.select_for_update()
        .filter(wanted, job_id=job_id)
        .order_by("kind", "name")
    )
    changed = []
    for row in locked:
        merged = merge_stats(_stats_of(row), stats[(row.kind, row.name)])
        row.count, row.min_step, row.max_step, row.min_ts, row.max_ts = merged
        changed.append(row)
    MetricSeries.objects.bulk_update(
        changed, ["count", "min_step", "max_step", "min_ts", "max_ts"], batch_size=500
    )
    for key, acc in _stored_rollups(job_id, rollups).items():
        rollups[key] = merge_acc(acc, rollups[key])
    write_rollups(MetricRollup, job_id, rollups)


def _stats_of(row: Any) -> list:
    return [row.count, row.min_step, row.max_step, row.min_ts, row.max_ts]


def _stored_rollups(job_id: int, rollups: dict[RollupKey, Acc]) -> dict[RollupKey, Acc]:
    """The stored buckets among `rollups`' keys, a few queries of bounded size."""
    groups: dict[tuple[str, str, str, int], list[int]] = defaultdict(list)
    for kind, name, axis, level, bucket in rollups:
        groups[(kind, name, axis, level)].append(bucket)
    terms: list[tuple[Q, int]] = []
    for (kind, name, axis, level), buckets in groups.items():
        lo, hi = min(buckets), max(buckets)
        if hi - lo < 4 * len(buckets) + 16:  # compact: a range reads few extra rows
            where, size = Q(bucket__range=(lo, hi)), 2
        else:
            where, size = Q(bucket__in=buckets), len(buckets)
        terms.append((Q(kind=kind, name=name, axis=axis, level=level) & where, size + 4))
    found: dict[RollupKey, Acc] = {}
    start = 0
    while start < len(terms):
        wanted, params = Q(), 0
        while start < len(terms) and (params == 0 or params + terms[start][1] <= 10_000):
            wanted |= terms[start][0]
            params += terms[start][1]
            start += 1
        rows = MetricRollup.objects.filter(wanted, job_id=job_id).values_list(
            "kind", "name", "axis", "level", "bucket", *ROLLUP_FIELDS
        )
        for row in rows:
            key = row[:5]
            if key in rollups:
                found[key] = list(row[5:])
    return found


def aggregate(
    points: Iterable[tuple[str, str, int, float, float]],
) -> tuple[dict[tuple[str, str], list], dict[RollupKey, Acc]]:
    """Series stats and rollup buckets of (kind, name, step, ts, value) points, in stored order.

    Stats are [count, min_step, max_step, min_ts, max_ts] per (kind, name). Pure: also used by
    the migration that builds the rollups of points stored before them.
    """
    stats: dict[tuple[str, str], list] = {}
    finest: dict[RollupKey, Acc] = {}
    first_level = LEVELS[0]
    for kind, name, step, ts, value in points:
        st = stats.get((kind, name))
        if st is None:
            stats[(kind, name)] = [1, step, step, ts, ts]
        else:
            st[0] += 1
            st[1], st[2] = min(st[1], step), max(st[2], step)
            st[3], st[4] = min(st[3], ts), max(st[4], ts)
        for axis, x in (("step", step), ("time", ts)):
            key = (kind, name, axis, first_level, bucket_of(x, first_level))
            acc = finest.get(key)
            if acc is None:
                finest[key] = [1, x, value, x, value, x, value, x, value]
            else:
                _add_point(acc, x, value)
    rollups = dict(finest)
    below, below_level = finest, first_level
    for level in LEVELS[1:]:
        shift = level - below_level
        above: dict[RollupKey, Acc] = {}
        for key in sorted(below, key=itemgetter(0, 1, 2, 4)):  # x order inside each series
            kind, name, axis, _, bucket = key
            up = (kind, name, axis, level, bucket >> shift)
            acc = above.get(up)
            above[up] = list(below[key]) if acc is None else merge_acc(acc, below[key])
        rollups.update(above)
        below, below_level = above, level
    return stats, rollups


def bucket_of(x: float, level: int) -> int:
    if isinstance(x, int):
        return x >> level  # steps: exact, floor division
    return max(-BUCKET_LIMIT, min(BUCKET_LIMIT, floor(x / 2**level)))


def _add_point(acc: Acc, x: float, y: float) -> None:
    acc[0] += 1
    if x < acc[1]:
        acc[1], acc[2] = x, y
    if x >= acc[3]:
        acc[3], acc[4] = x, y
    if y < acc[6]:
        acc[5], acc[6] = x, y
    if y > acc[8]:
        acc[7], acc[8] = x, y


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
    """Upsert rollup buckets (already merged with what is stored) for one job."""
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


def _checked(points: list[Any]) -> list[dict]:
    for i, point in enumerate(points):
        if not (
            isinstance(point, dict)
            and type(point.get("seq")) is int
            and 0 <= point["seq"] <= BIGINT_MAX
            and point.get("kind") in KINDS
            and isinstance(point.get("name"), str)
            and 0 < len(point["name"]) <= MAX_NAME
            and "\x00" not in point["name"]  # PostgreSQL text cannot hold NUL
            and type(point.get("step")) is int
            and 0 <= point["step"] <= BIGINT_MAX
            and _finite(point.get("value"))
            and _finite(point.get("ts"))
        ):
            raise BadRequest(
                f"point {i} must have seq (int >= 0), kind (train|validation|system), name (1 to "
                f"{MAX_NAME} characters, no NUL), step (int >= 0), value and ts (finite numbers); "
                f"seq and step are at most {BIGINT_MAX}"
            )
    return points


def _finite(value: object) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return isfinite(value)
    except OverflowError:  # an int beyond a float's range
        return False


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

    Starts at the coarsest level with at least max_points / 2 buckets in the x range (each
    bucket gives up to 4 points); finer ones follow in case the buckets turn out too sparse.
    """
    if lo is None or hi is None:
        return []
    for i in range(len(LEVELS) - 1, -1, -1):
        level = LEVELS[i]
        buckets = min(bucket_of(hi, level) - bucket_of(lo, level) + 1, total)
        if 2 * buckets >= max_points:
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
    rows = (
        MetricPoint.objects.filter(job_id=job_id, kind=kind, name__in=names)
        .order_by("name", x_field, "attempt", "seq")
        .values_list("name", x_field, "value")
    )
    out = {}
    for name, group in groupby(rows, key=itemgetter(0)):
        points = list(group)
        xs = [p[1] for p in points]
        ys = [p[2] for p in points]
        out[name] = _downsampled(xs, ys, max_points, len(points), False)
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

    A plain DISTINCT reads every index entry, so it grows with the points stored; this
    recursive query makes one index probe per name instead, on PostgreSQL and SQLite alike.
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
