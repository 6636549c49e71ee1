"""Helpers shared by the benchmarks: databases, Django set-up, ledger fixtures, small stats.

Nothing here imports Django at module level: the orchestrator in `bench/run.py` uses the
database helpers without setting Django up, and each benchmark child process calls
`django_setup()` once its environment points at its own database.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"


# --- PostgreSQL ----------------------------------------------------------------------------


def db_url(name: str) -> str:
    return f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(
        host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(sql)


def create_db(name: str) -> None:
    """A fresh, empty database (an old one of the same name is dropped first)."""
    drop_db(name)
    _admin(f'CREATE DATABASE "{name}"')


def drop_db(name: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_version() -> str:
    import psycopg

    with psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres") as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0])


# --- Django --------------------------------------------------------------------------------


def django_setup() -> None:
    """Set Django up against $DATABASE_URL (set by the orchestrator) and migrate it."""
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("a benchmark child needs DATABASE_URL pointing at its PostgreSQL db")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def make_user(username: str = "bench"):
    from django.contrib.auth.models import User

    return User.objects.create(username=username, is_active=True)


def make_cluster(gpus: int, name: str = "bench-noop", nodes: int = 0):
    """A noop cluster of `gpus` GPUs; with `nodes`, that many nodes sharing them equally."""
    from jobs.models import Cluster

    settings = {"gpus": gpus, **({"nodes": nodes} if nodes else {})}
    return Cluster.objects.create(name=name, kind="noop", settings=settings)


def make_teams(n: int, quota: int, cluster, user=None) -> list:
    from jobs.models import ClusterGrant, Membership, Team

    teams = Team.objects.bulk_create(
        [Team(name=f"t{i:03d}", gpu_quota=quota, default_cluster=cluster) for i in range(n)]
    )
    # bulk_create skips Team.save, which grants a team its default cluster: without the grant
    # the scheduler stops the teams' jobs rather than admit them (jobs.grants).
    ClusterGrant.objects.bulk_create([ClusterGrant(team=t, cluster=cluster) for t in teams])
    if user is not None:
        Membership.objects.bulk_create(
            [Membership(team=t, user=user, role="member") for t in teams]
        )
    return teams


def queue_jobs(n: int, teams: list, cluster, user, prefix: str = "q", batch: int = 5000) -> None:
    """`n` QUEUED one-GPU jobs spread round-robin over `teams` (bulk_create, default status)."""
    from jobs.models import Job

    for start in range(0, n, batch):
        Job.objects.bulk_create(
            [
                Job(
                    run_id=f"{prefix}{i:08d}",
                    team=teams[i % len(teams)],
                    user=user,
                    cluster=cluster,
                    total_gpus=1,
                    entrypoint=["true"],
                )
                for i in range(start, min(n, start + batch))
            ],
            batch_size=batch,
        )


def analyze() -> None:
    """Fresh planner statistics after a bulk load (what autovacuum would do soon after)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def running_job(team, user, cluster, run_id: str):
    """A job in RUNNING with a current attempt 1, as a runner would see it (setup code)."""
    from django.utils import timezone

    from jobs.models import Attempt, Job

    job = Job.objects.create(
        run_id=run_id, team=team, user=user, cluster=cluster, total_gpus=1, entrypoint=["true"]
    )
    now = timezone.now()
    attempt = Attempt.objects.create(
        job=job,
        number=1,
        total_gpus=1,
        backend_name=f"sf-{run_id}-a1",
        job_ref=f"noop:sf-{run_id}-a1",
        submitted_at=now,
        pending_at=now,
        start_time=now,
    )
    Job.objects.filter(pk=job.pk).update(
        status="RUNNING", attempt_count=1, current_attempt=attempt, status_changed_at=now
    )
    return job


# --- small utilities -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float, alive=lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("the server exited during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listened on port {port} within {timeout:.0f} s")


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
    return ordered[rank - 1]


def summary_ms(values: list[float]) -> dict:
    return {
        "runs": len(values),
        "median_ms": round(statistics.median(values) * 1000, 1),
        "p95_ms": round(percentile(values, 95) * 1000, 1),
        "min_ms": round(min(values) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }
