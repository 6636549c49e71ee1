"""Benchmark: reading one job's 1,000,000 metric points for its Charts tab (`jobs.metrics`).

`.venv/bin/python bench/metrics_bench.py` — needs PostgreSQL on 127.0.0.1:5432 (as `make bench`).
Creates its own database `sf_bench_metrics`, loads 1,000,000 train points (4 metrics of 250,000
steps each) and 4,000 validation points for one RUNNING job with COPY, ANALYZEs, then times
`series()` (x=step and x=time, 2,000 points per series) and `latest()`: median of 5 after one
warm-up. Prints JSON; the database is dropped afterwards. Aim: the Charts data under 150 ms.
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


def load(job_id: int) -> None:
    from django.db import connection

    t0 = 1_700_000_000.0
    columns = "job_id, attempt, seq, kind, name, step, value, ts"
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY jobs_metricpoint ({columns}) FROM STDIN") as copy:
            seq = 0
            for step in range(STEPS):
                for i, name in enumerate(TRAIN_NAMES):
                    value = math.exp(-step / 50_000) * (i + 1) + 0.01 * math.sin(step)
                    copy.write_row((job_id, 1, seq, "train", name, step, value, t0 + step))
                    seq += 1
            for step in range(0, STEPS, STEPS // 1000):
                for name in ("accuracy", "f1", "bleu", "perplexity"):
                    copy.write_row((job_id, 1, seq, "validation", name, step, 0.5, t0 + step))
                    seq += 1


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
    from jobs.metrics import lttb
    from jobs.models import MetricPoint

    start = time.perf_counter()
    rows = list(
        MetricPoint.objects.filter(job_id=job_id, kind="train")
        .order_by("name", "step", "attempt", "seq")
        .values_list("name", "step", "value")
    )
    fetched = time.perf_counter()
    xs = [r[1] for r in rows[:STEPS]]
    ys = [r[2] for r in rows[:STEPS]]
    begin_lttb = time.perf_counter()
    lttb(xs, ys, 2000)
    one_lttb = time.perf_counter() - begin_lttb
    return {
        "fetch_ms": round((fetched - start) * 1000, 1),
        "lttb_ms_per_series": round(one_lttb * 1000, 1),
        "rows": len(rows),
    }


def measure() -> dict:
    from django.db import connection

    from jobs import metrics
    from jobs.models import MetricPoint

    user = common.make_user()
    cluster = common.make_cluster(8)
    team = common.make_teams(1, 8, cluster, user)[0]
    job = common.running_job(team, user, cluster, "metrics-bench")
    setup = time.perf_counter()
    load(job.pk)
    common.analyze()
    setup_s = time.perf_counter() - setup
    loss = metrics.series(job.pk, "train")["loss"]
    assert (loss["total"], len(loss["x"])) == (STEPS, 2000), loss["total"]
    assert MetricPoint.objects.filter(job=job, kind="train").count() == STEPS * len(TRAIN_NAMES)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    return {
        "points": STEPS * len(TRAIN_NAMES),
        "setup_s": round(setup_s, 1),
        "series_step": timed(lambda: metrics.series(job.pk, "train", "step", 2000)),
        "series_time": timed(lambda: metrics.series(job.pk, "train", "time", 2000)),
        "series_validation": timed(lambda: metrics.series(job.pk, "validation")),
        "latest_train": timed(lambda: metrics.latest(job.pk, "train")),
        "split": split_series(job.pk),
        "postgres": version,
        "cpus": os.cpu_count(),
    }


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
