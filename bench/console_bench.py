"""Console pages at scale: the jobs list and a job page with 1,000,000 jobs in the ledger and a
job of 1,000,000 log lines; server response time of the HTML, measured in-process."""

from __future__ import annotations

import statistics
import time

ROWS = 1_000_000
LOG_LINES = 1_000_000


def run() -> dict:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    from jobs.bootstrap import ensure_demo
    from jobs.models import Job, Team
    from jobs.stores import logstore

    ensure_demo()
    user = User.objects.create_user("viewer", password="pw")  # not staff: the team filter applies
    team = Team.objects.get(name="demo")
    team.membership_set.create(user=user)
    started = time.perf_counter()
    with connection.cursor() as cursor:  # one INSERT … SELECT: far faster than the ORM here
        cursor.execute(
            """INSERT INTO jobs_job (run_id, name, team_id, user_id, cluster_id, total_gpus,
               entrypoint, env, priority, status, status_reason, status_changed_at, submitted_at,
               retry_count, attempt_count, max_retries, retry_cooldown_s, "then",
               follow_on_specs, follow_on_name, window_policy, paused_by_window, nodes,
               gpu_type, image)
               SELECT 'b' || g, 'job ' || g, %s, %s, %s, 1, '["true"]', '{}', 0,
                      (ARRAY['QUEUED','RUNNING','SUCCEEDED','FAILED'])[1 + g %% 4], '', now(),
                      now(), 0, 0, 0, 30, '[]', '{}', '', 'wait', false, 1, '', ''
               FROM generate_series(1, %s) g""",
            [team.pk, user.pk, team.default_cluster_id, ROWS],
        )
        cursor.execute("ANALYZE jobs_job")
    seeded = time.perf_counter() - started
    job = Job.objects.order_by("-pk").first()
    for start in range(0, LOG_LINES, 20_000):
        logstore.append(
            job.pk,
            1,
            [
                {"seq": n, "stream": "stdout", "ts": 0.0, "text": f"line {n} " + "x" * 60}
                for n in range(start, start + 20_000)
            ],
        )
    client = Client()
    client.force_login(user)
    return {
        "jobs": ROWS,
        "seed_s": round(seeded, 1),
        "list": _time(client, "/"),
        "list_filtered": _time(client, "/?status=FAILED"),
        "list_page_100": _time(client, f"/?before={job.pk - 5000}"),
        "job_page": _time(client, f"/jobs/{job.pk}/"),
    }


def _time(client, path: str, runs: int = 15) -> dict:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    samples.sort()
    return {
        "median_ms": round(statistics.median(samples), 1),
        "p95_ms": round(samples[int(len(samples) * 0.95) - 1], 1),
    }
