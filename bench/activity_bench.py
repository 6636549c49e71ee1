"""Benchmark: the activity watch's cost (issue 50, point 6).

`.venv/bin/python bench/run.py --only activity` — one team with an idle and a hang policy and
1,000 RUNNING jobs on 8 GPUs each, every one with a reporting runner.
- ingest: `POST /api/v1/ingest/activity` through Django's test client with each job's token,
  one report per request as the runner sends it (one rank: 8 GPU utilisations, CPU, lines,
  metric points = 11 samples), 2,000 reports over the 1,000 attempts; samples/s and the
  queries per report (constant: none per sample);
- tick: `watch_activity` over the 1,000 watched attempts, median of 15, when none is due (one
  query) and when 100 are idle past idle_after (each warned once, then nothing more to do).
"""

from __future__ import annotations

import datetime as dt
import time

from bench import common

JOBS, REPORTS, TICKS, GPUS = 1_000, 2_000, 15, 8
SAMPLES_PER_REPORT = GPUS + 3  # the utilisations, the CPU time, the lines, the metric points


def seed(now: dt.datetime) -> tuple[list, list]:
    from jobs.models import ActivityPolicy, Attempt, AttemptActivity, Job

    user = common.make_user("activity")
    cluster = common.make_cluster(JOBS * GPUS)
    (team,) = common.make_teams(1, JOBS * GPUS, cluster, user)
    ActivityPolicy.objects.create(team=team, idle_after_s=1800, hang_after_s=900)
    start = now - dt.timedelta(hours=2)
    jobs = Job.objects.bulk_create(
        [
            Job(
                run_id=f"act{n:06d}", team=team, user=user, cluster=cluster, total_gpus=GPUS,
                entrypoint=["true"], status="RUNNING", attempt_count=1, status_changed_at=start,
            )
            for n in range(JOBS)
        ]
    )  # fmt: skip
    attempts = Attempt.objects.bulk_create(
        [
            Attempt(
                job=job, number=1, total_gpus=GPUS, backend_name=f"sf-{job.run_id}-a1",
                job_ref=f"noop:sf-{job.run_id}-a1", start_time=start,
            )
            for job in jobs
        ]
    )  # fmt: skip
    for job, attempt in zip(jobs, attempts, strict=True):
        job.current_attempt = attempt
    Job.objects.bulk_update(jobs, ["current_attempt"], batch_size=1000)
    AttemptActivity.objects.bulk_create(
        [AttemptActivity(attempt=a, busy_at=now, moved_at=now, stepped_at=now) for a in attempts]
    )
    return jobs, attempts


def ingest(jobs: list) -> dict:
    from django.db import connection
    from django.test import Client

    from jobs.job_tokens import job_token

    clients = [Client(HTTP_AUTHORIZATION=f"Bearer {job_token(j.pk, 1)}") for j in jobs]
    body = {
        "attempt": 1,
        "steps": 3,
        "ranks": [{"rank": 0, "lines": 2, "cpu_s": 4.5, "gpu_util": [87.0] * GPUS}],
    }
    queries: list[str] = []

    def count(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        answer = clients[0].post("/api/v1/ingest/activity", body, content_type="application/json")
    assert answer.status_code == 200, answer.content
    started = time.perf_counter()
    for n in range(REPORTS):
        clients[n % len(clients)].post(
            "/api/v1/ingest/activity", body, content_type="application/json"
        )
    took = time.perf_counter() - started
    return {
        "reports": REPORTS,
        "samples_per_report": SAMPLES_PER_REPORT,
        "reports_per_s": round(REPORTS / took),
        "samples_per_s": round(REPORTS * SAMPLES_PER_REPORT / took),
        "queries_per_report": len(queries),
    }


def ticks(now: dt.datetime) -> dict:
    from django.db import connection

    from jobs.loops.activity import watch_activity

    runs = []
    for _ in range(TICKS):
        started = time.perf_counter()
        result = watch_activity(now)
        runs.append(time.perf_counter() - started)
    assert result.watched == JOBS and not (result.warned or result.hung), result
    queries: list[str] = []

    def count(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        watch_activity(now)
    return {**common.summary_ms(runs), "queries": len(queries), "watched": result.watched}


def run() -> dict:
    from django.utils import timezone

    from jobs.models import AttemptActivity

    now = timezone.now()
    jobs, attempts = seed(now)
    common.analyze()
    figures = {"attempts": JOBS, "ingest": ingest(jobs)}
    later = timezone.now()
    figures["tick_none_due"] = ticks(later)
    idle = [a.pk for a in attempts[:100]]
    AttemptActivity.objects.filter(attempt_id__in=idle).update(
        busy_at=later - dt.timedelta(hours=1)
    )
    from jobs.loops.activity import watch_activity

    started = time.perf_counter()
    warned = watch_activity(later).warned
    figures["tick_warning_100_s"] = round(time.perf_counter() - started, 3)
    assert len(warned) == 100, len(warned)
    figures["tick_after_warnings"] = ticks(later)
    return figures
