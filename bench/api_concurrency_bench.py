"""API latency under 50 concurrent clients against the real ASGI server, for a fixed duration.

The server is the one `bench/api_bench.py` starts (`uvicorn starforge.asgi:application`, one
process). Before the clock: 2,000 jobs over one team on a `noop` cluster, half of them admitted
and launched by the real scheduler and launcher so their timelines have events. Then CLIENTS
threads, each on a keep-alive connection of its own with the user's API token, send a weighted
mix of requests back to back for DURATION_S seconds. Every answer other than the expected
status, and every broken connection, counts as an error (aim: none).
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import defaultdict
from pathlib import Path

from bench import common
from bench.api_bench import Server

CLIENTS = 50
DURATION_S = 20.0
JOBS = 2_000
# (endpoint label, weight): what a console and a few CLIs polling mostly do is read.
MIX = [
    ("GET /api/v1/jobs", 30),
    ("GET /api/v1/jobs/{id}", 30),
    ("GET /api/v1/jobs/{id}/events", 20),
    ("GET /api/v1/usage", 10),
    ("POST /api/v1/jobs", 10),
]


def run(var_dir: Path) -> dict:
    from jobs.auth import issue_token

    user = common.make_user()
    cluster = common.make_cluster(gpus=100_000)
    (team,) = common.make_teams(1, JOBS, cluster, user)
    started = time.perf_counter()
    job_ids = _seed(team, cluster, user)
    setup_s = time.perf_counter() - started
    token = issue_token(user, name="bench")
    submit_body = json.dumps(
        {"entrypoint": ["true"], "gpus": 0, "cluster": cluster.name, "team": team.name}
    ).encode()

    with Server(var_dir) as server:
        _warm_up(server.port, token, job_ids, submit_body)
        samples = _load(server.port, token, job_ids, submit_body)
    return {
        "clients": CLIENTS,
        "duration_s": DURATION_S,
        "jobs": JOBS,
        "mix": dict(MIX),
        "setup_s": round(setup_s, 1),
        **_summary(samples),
    }


def _seed(team, cluster, user) -> list[int]:
    """JOBS queued jobs; half admitted and launched (PENDING, with their events)."""
    from jobs.loops.launcher import launch_attempts
    from jobs.loops.scheduler import admit_queued_jobs
    from jobs.models import Job, Team

    common.queue_jobs(JOBS, [team], cluster, user, prefix="c")
    Team.objects.filter(pk=team.pk).update(gpu_quota=JOBS // 2)
    admitted = admit_queued_jobs().admitted
    for i in range(0, len(admitted), 200):
        launch_attempts(admitted[i : i + 200])
    Team.objects.filter(pk=team.pk).update(gpu_quota=JOBS * 10)  # room for what clients submit
    common.analyze()
    return list(Job.objects.values_list("pk", flat=True))


def _request(label: str, job_id: int, body: bytes) -> tuple[str, str, bytes | None, int]:
    """(method, path, body, expected status) for one request of the mix."""
    if label == "GET /api/v1/jobs":
        return "GET", "/api/v1/jobs?limit=50", None, 200
    if label == "GET /api/v1/jobs/{id}":
        return "GET", f"/api/v1/jobs/{job_id}", None, 200
    if label == "GET /api/v1/jobs/{id}/events":
        return "GET", f"/api/v1/jobs/{job_id}/events", None, 200
    if label == "GET /api/v1/usage":
        return "GET", "/api/v1/usage?by=user", None, 200
    return "POST", "/api/v1/jobs", body, 201


def _send(conn, token: str, label: str, job_id: int, body: bytes) -> tuple[float, str | None]:
    method, path, payload, expected = _request(label, job_id, body)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    started = time.perf_counter()
    conn.request(method, path, body=payload, headers=headers)
    resp = conn.getresponse()
    raw = resp.read()
    elapsed = time.perf_counter() - started
    return (
        elapsed,
        None if resp.status == expected else f"{label}: HTTP {resp.status} {raw[:200]!r}",
    )


def _warm_up(port: int, token: str, job_ids: list[int], body: bytes) -> None:
    """Each endpoint once, outside the clock; a wrong answer here stops the benchmark."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for label, _ in MIX:
        _, error = _send(conn, token, label, job_ids[0], body)
        if error:
            raise RuntimeError(f"warm-up failed: {error}")
    conn.close()


def _load(port: int, token: str, job_ids: list[int], body: bytes) -> list[tuple[str, float, str]]:
    """(label, seconds, error or "") for every request CLIENTS threads sent in DURATION_S."""
    samples: list[tuple[str, float, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)
    labels, weights = zip(*MIX, strict=True)

    def client(seed: int) -> None:
        rng = random.Random(seed)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine: list[tuple[str, float, str]] = []
        barrier.wait()
        deadline = time.perf_counter() + DURATION_S
        while time.perf_counter() < deadline:
            label = rng.choices(labels, weights)[0]
            try:
                elapsed, error = _send(conn, token, label, rng.choice(job_ids), body)
            except Exception as exc:  # counted as an error; a fresh connection goes on
                elapsed, error = 0.0, f"{label}: {type(exc).__name__}: {exc}"
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            mine.append((label, elapsed, error or ""))
        conn.close()
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples


def _summary(samples: list[tuple[str, float, str]]) -> dict:
    by_label: dict[str, list[float]] = defaultdict(list)
    errors = [error for _, _, error in samples if error]
    for label, elapsed, error in samples:
        if not error:
            by_label[label].append(elapsed)

    def figures(times: list[float], count: int) -> dict:
        return {
            "requests": count,
            "per_s": round(count / DURATION_S, 1),
            "p50_ms": round(common.percentile(times, 50) * 1000, 1) if times else None,
            "p99_ms": round(common.percentile(times, 99) * 1000, 1) if times else None,
            "max_ms": round(max(times) * 1000, 1) if times else None,
        }

    counts: dict[str, int] = defaultdict(int)
    for label, _, _ in samples:
        counts[label] += 1
    every = [t for times in by_label.values() for t in times]
    return {
        "overall": figures(every, len(samples)),
        "endpoints": {label: figures(by_label[label], counts[label]) for label, _ in MIX},
        "errors": len(errors),
        "first_errors": errors[:5],
    }
