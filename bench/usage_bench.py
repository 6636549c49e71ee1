"""Benchmark: `GET /api/v1/usage` for a team with 100,000 ended attempts (`metering`).

`.venv/bin/python bench/run.py --only usage` — one team, 20 users, 2 clusters, 100,000 ended
attempts (1-8 GPUs, up to 6 h each) spread over the last 60 days and 50 attempts running now.
`meter_s` times `meter_ended()` moving the ended ones into the usage records, `check_s` one
`check_usage_records()` over them (outside the request clocks); then `GET /api/v1/usage?team=…`
`&by=user` / `&by=day` over the 60 days and `by=user` with the default range (this month),
through Django's test client with a bearer token: median of 25 after one warm-up.
Aim: median < 100 ms.
"""

from __future__ import annotations

import datetime as dt
import random
import time

from bench import common

ATTEMPTS, RUNNING, USERS, DAYS, RUNS, BATCH = 100_000, 50, 20, 60, 25, 5_000


def seed(team, users: list, clusters: list, now: dt.datetime) -> None:
    from jobs.models import Attempt, Job

    rng = random.Random(6)
    for start in range(0, ATTEMPTS + RUNNING, BATCH):
        numbers = range(start, min(ATTEMPTS + RUNNING, start + BATCH))
        jobs = Job.objects.bulk_create(
            [
                Job(
                    run_id=f"u{n:08d}",
                    team=team,
                    user=users[n % len(users)],
                    cluster=clusters[n // len(users) % len(clusters)],
                    total_gpus=1 + n % 8,
                    entrypoint=["true"],
                    status="RUNNING" if n >= ATTEMPTS else "SUCCEEDED",
                    attempt_count=1,
                )
                for n in numbers
            ]
        )
        attempts = []
        for n, job in zip(numbers, jobs, strict=True):
            began = now - dt.timedelta(seconds=rng.randrange(60, DAYS * 86400))
            ended = None if n >= ATTEMPTS else began + dt.timedelta(seconds=rng.randrange(6 * 3600))
            attempts.append(
                Attempt(
                    job=job,
                    number=1,
                    total_gpus=job.total_gpus,
                    backend_name=f"sf-{job.run_id}-a1",
                    start_time=began,
                    end_time=min(ended, now) if ended else None,
                )
            )
        Attempt.objects.bulk_create(attempts)


def timed_get(client, path: str, params: dict) -> dict:
    answer = client.get(path, params)  # warm-up; also checks the answer
    assert answer.status_code == 200, answer.content
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        client.get(path, params)
        runs.append(time.perf_counter() - start)
    return {**common.summary_ms(runs), "rows": len(answer.json()["rows"])}


def run() -> dict:
    from django.test import Client
    from django.utils import timezone

    from jobs.actions.tokens import issue_token
    from metering.consistency import check_usage_records
    from metering.models import UsageRecord
    from metering.records import meter_ended

    caller = common.make_user("usage-reader")
    clusters = [common.make_cluster(1000, "gpu-a"), common.make_cluster(1000, "gpu-b")]
    team = common.make_teams(1, 100, clusters[0], caller)[0]
    users = [common.make_user(f"user{i:02d}") for i in range(USERS)]
    now = timezone.now()
    started = time.perf_counter()
    seed(team, users, clusters, now)
    setup_s = time.perf_counter() - started
    started = time.perf_counter()
    metered = meter_ended()
    meter_s = time.perf_counter() - started
    assert metered == ATTEMPTS, metered
    common.analyze()
    started = time.perf_counter()
    check = check_usage_records()
    check_s = time.perf_counter() - started
    assert check.violations == [] and check.metered_attempts == ATTEMPTS, check.violations[:3]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {issue_token(caller)}")
    since = (now - dt.timedelta(days=DAYS)).date().isoformat()
    window = {"team": team.name, "since": since}
    return {
        "attempts": ATTEMPTS,
        "running": RUNNING,
        "records": UsageRecord.objects.count(),
        "setup_s": round(setup_s, 1),
        "meter_s": round(meter_s, 2),
        "check_s": round(check_s, 2),
        "by_user": timed_get(client, "/api/v1/usage", {**window, "by": "user"}),
        "by_day": timed_get(client, "/api/v1/usage", {**window, "by": "day"}),
        "by_user_this_month": timed_get(client, "/api/v1/usage", {"team": team.name, "by": "user"}),
    }
