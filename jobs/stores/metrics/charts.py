"""What a job's charts and tables read of its metrics: `series` groups points into one series
per metric name and downsamples each with LTTB, so a chart of a million points stays a few
thousand points on the wire; `latest` and `latest_of` give each metric's last point.

A series of at most `max_points` points is read raw; a longer one from the rollups
(`jobs.stores.metrics.rollups`): the coarsest level with at least max_points / 3 buckets in its
x range (fewer than 4/3 x max_points buckets, since levels are a factor 4 apart), expanded to
each bucket's first, lowest, highest and last points (three or four distinct ones wherever a
series moves; a finer level is read when they fall short) and reduced with LTTB. Its global
lowest and highest points are kept.
"""

from collections.abc import Iterable, Sequence
from itertools import groupby, repeat
from operator import itemgetter
from typing import Any

from django.db.models import OuterRef, Q, Subquery

from jobs.models import MetricChunk, MetricRollup, MetricSeries
from jobs.stores.metrics.chunks import unpack
from jobs.stores.metrics.rollups import LEVELS, ROLLUP_FIELDS, bucket_of

DEFAULT_MAX_POINTS = 2000
X_FIELDS = {"step": "step", "time": "ts"}


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
