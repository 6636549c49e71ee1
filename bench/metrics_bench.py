"""Benchmark: reading one job's 1,000,000 metric points for its Charts tab (`jobs.stores.metrics`).

`.venv/bin/python bench/metrics_bench.py` — needs PostgreSQL on 127.0.0.1:5432 (as `make bench`).
Creates its own database `sf_bench_metrics`, loads 1,000,000 train points (4 metrics of 250,000
steps each) and 4,000 validation points for one RUNNING job as ingest stores them (chunks of one
series and batch, written with COPY), builds their rollups as the migration's backfill does
(`rollup_build_s`), ANALYZEs, then times `series()` (x=step and x=time, 2,000
points per series: read from the rollups), the same series read point by point as before the
rollups (`raw_series_*`), and `latest()`: median of 5 after one warm-up. `ingest` posts 200,000
points of 4 metrics to `POST /api/v1/ingest/metrics` with the job token, in the runner's batches
(`sf.shipping.BATCH_POINTS`), through Django's test client: authentication, parsing, validation,
points and rollups as a runner's request has them, without the HTTP server. Bodies are encoded
and one empty batch sent before the clock starts. Prints JSON; the database is dropped
afterwards. Aims: the Charts data under 150 ms, ingest at least 100,000 points/s.
Also run by `bench/run.py --only metrics`.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402

DB = "sf_bench_metrics"
TRAIN_NAMES = ("loss", "lr", "throughput", "grad_norm")
STEPS = 250_000
RUNS = 5
INGEST_POINTS = 200_000
INGEST_AIM = 100_000  # points/s


def load(job_id: int) -> None:
    """The points as ingest stores them: chunks of one series, BATCH_POINTS points per batch."""
    from sf.shipping import BATCH_POINTS

    from jobs.stores.metrics.chunks import chunk, write_chunks

    t0 = 1_700_000_000.0
    train = [[] for _ in TRAIN_NAMES]
    seq = 0
    for step in range(STEPS):
        for i, points in enumerate(train):
            value = math.exp(-step / 50_000) * (i + 1) + 0.01 * math.sin(step)
            points.append((seq, step, value, t0 + step))
            seq += 1
    validation = []
    for step in range(0, STEPS, STEPS // 1000):
        for name in ("accuracy", "f1", "bleu", "perplexity"):
            validation.append((name, (seq, step, 0.5, t0 + step)))
            seq += 1
    per_series = BATCH_POINTS // len(TRAIN_NAMES)  # a batch holds every metric's next steps
    chunks = [
        chunk("train", name, *zip(*points[start : start + per_series], strict=True))
        for name, points in zip(TRAIN_NAMES, train, strict=True)
        for start in range(0, STEPS, per_series)
    ]
    chunks += [
        chunk("validation", name, *zip(*[p for n, p in validation if n == name], strict=True))
        for name in ("accuracy", "f1", "bleu", "perplexity")
    ]
    write_chunks(job_id, 1, chunks)


def timed(fn) -> dict:
    fn()  # warm-up: connection, plan cache
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return {
        "median_ms": round(statistics.median(runs) * 1000, 1),
        "min_ms": round(min(runs) * 1000, 1),
    }


def split_series(job_id: int) -> dict:
    """series() for x=step split into its database fetch and its LTTB share."""
    from jobs.models import MetricChunk
    from jobs.stores.metrics.charts import lttb
    from jobs.stores.metrics.chunks import unpack

    start = time.perf_counter()
    chunks = list(
        MetricChunk.objects.filter(job_id=job_id, kind="train", name=TRAIN_NAMES[0])
        .order_by("first_seq")
        .values_list("points", flat=True)
    )
    fetched = time.perf_counter()
    xs, ys = [], []
    for packed in chunks:
        _, steps, values, _ = unpack(packed)
        xs.extend(steps)
        ys.extend(values)
    begin_lttb = time.perf_counter()
    lttb(xs, ys, 2000)
    one_lttb = time.perf_counter() - begin_lttb
    return {
        "fetch_ms_per_series": round((fetched - start) * 1000, 1),
        "lttb_ms_per_series": round(one_lttb * 1000, 1),
        "points_per_series": len(xs),
    }


def build_rollups(job_id: int) -> float:
    """Series rows and rollups of the loaded points, as the migration's backfill builds them;
    returns its seconds."""
    from jobs.models import MetricRollup, MetricSeries
    from jobs.stores.metrics.chunks import stored_points
    from jobs.stores.metrics.rollups import aggregate, write_rollups

    start = time.perf_counter()
    points = [
        (kind, name, step, ts, value) for _, _, kind, name, step, value, ts in stored_points(job_id)
    ]
    stats, rollups = aggregate(points)
    MetricSeries.objects.bulk_create(
        [
            MetricSeries(
                job_id=job_id,
                kind=kind,
                name=name,
                count=st[0],
                min_step=st[1],
                max_step=st[2],
                min_ts=st[3],
                max_ts=st[4],
            )
            for (kind, name), st in stats.items()
        ]
    )
    write_rollups(MetricRollup, job_id, rollups)
    return time.perf_counter() - start


def ingest(job_id: int) -> dict:
    """The runner's metric ingest over the API for INGEST_POINTS points, rollups included."""
    from django.test import Client
    from sf.shipping import BATCH_POINTS

    from jobs.job_tokens import job_token

    t0 = 1_700_000_000.0
    points = [
        {
            "seq": seq,
            "kind": "train",
            "name": TRAIN_NAMES[seq % len(TRAIN_NAMES)],
            "step": seq // len(TRAIN_NAMES),
            "value": math.sin(seq / 1000),
            "ts": t0 + seq / 100,
        }
        for seq in range(INGEST_POINTS)
    ]
    bodies = [
        json.dumps({"attempt": 1, "points": points[i : i + BATCH_POINTS]})
        for i in range(0, INGEST_POINTS, BATCH_POINTS)
    ]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {job_token(job_id, 1)}")
    empty = json.dumps({"attempt": 1, "points": []})  # warm-up: URL conf, auth, connection
    response = client.post("/api/v1/ingest/metrics", empty, content_type="application/json")
    assert response.status_code == 200, response.content
    accepted = 0
    start = time.perf_counter()
    for body in bodies:
        response = client.post("/api/v1/ingest/metrics", body, content_type="application/json")
        assert response.status_code == 200, response.content
        accepted += response.json()["accepted"]
    seconds = time.perf_counter() - start
    assert accepted == INGEST_POINTS, accepted
    return {
        "points": INGEST_POINTS,
        "batch": BATCH_POINTS,
        "seconds": round(seconds, 2),
        "points_per_s": round(INGEST_POINTS / seconds),
        "ms_per_batch": round(seconds / len(bodies) * 1000, 1),
        "aim_points_per_s": INGEST_AIM,
    }


def measure() -> dict:
    from django.db import connection

    from jobs.models import MetricRollup
    from jobs.stores.metrics import charts
    from jobs.stores.metrics.chunks import stored_points

    user = common.make_user()
    cluster = common.make_cluster(8)
    team = common.make_teams(1, 8, cluster, user)[0]
    job = common.running_job(team, user, cluster, "metrics-bench")
    setup = time.perf_counter()
    load(job.pk)
    rollup_build_s = build_rollups(job.pk)
    common.analyze()
    setup_s = time.perf_counter() - setup
    loss = charts.series(job.pk, "train")["loss"]
    assert (loss["total"], len(loss["x"])) == (STEPS, 2000), loss["total"]
    assert sum(p[2] == "train" for p in stored_points(job.pk)) == STEPS * len(TRAIN_NAMES)
    names = list(TRAIN_NAMES)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    result = {
        "points": STEPS * len(TRAIN_NAMES),
        "setup_s": round(setup_s, 1),
        "rollup_build_s": round(rollup_build_s, 1),
        "rollup_rows": MetricRollup.objects.filter(job=job).count(),
        "series_step": timed(lambda: charts.series(job.pk, "train", "step", 2000)),
        "series_time": timed(lambda: charts.series(job.pk, "train", "time", 2000)),
        "raw_series_step": timed(lambda: charts._raw_series(job.pk, "train", "step", 2000, names)),
        "raw_series_time": timed(lambda: charts._raw_series(job.pk, "train", "ts", 2000, names)),
        "series_validation": timed(lambda: charts.series(job.pk, "validation")),
        "latest_train": timed(lambda: charts.latest(job.pk, "train")),
        "split": split_series(job.pk),
    }
    other = common.running_job(team, user, cluster, "metrics-bench-ingest")
    result["ingest"] = ingest(other.pk)
    result.update({"postgres": version, "cpus": os.cpu_count()})
    return result


def run() -> dict:
    """For bench/run.py: the database is already created, migrated and set up."""
    return measure()


def main() -> int:
    common.create_db(DB)
    os.environ["DATABASE_URL"] = common.db_url(DB)
    os.environ["SF_VAR_DIR"] = tempfile.mkdtemp(prefix="sf-bench-metrics-")
    os.environ.setdefault("SF_DEBUG", "0")
    os.environ.setdefault("SF_LOG_LEVEL", "WARNING")
    try:
        common.django_setup()
        result = measure()
        from django.db import connections

        connections.close_all()
    finally:
        common.drop_db(DB)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
