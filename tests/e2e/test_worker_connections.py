"""A Celery worker keeps its PostgreSQL sessions from one task to the next (starforge.celery).

Celery's Django fixup closed the connection pool around every task, so each tick and launch
opened a new session, whose backend planned every query cold, on the cores the web workers
share. A real worker on the project's settings runs a task that records the backend serving it:
later runs must be served by the sessions earlier ones opened, and after those backends are
terminated (a PostgreSQL restart, as far as the worker can tell) every task must still succeed,
on new sessions that are kept in turn.
"""

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from celery import Celery
from django.db import connection

from tests.e2e.backend_task import RUNS_KEY
from tests.e2e.stack import REDIS_URL, ROOT, kill_group, stack_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
DB = 15  # this test's own Redis database: its queue holds nothing of other tests
BROKER = urlunsplit(urlsplit(REDIS_URL)._replace(path=f"/{DB}"))
TASK = "tests.e2e.backend_task.backend"


def _database_url() -> str:
    """The test database, as the worker's DATABASE_URL."""
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def _worker(var: Path) -> subprocess.Popen:
    env = {**stack_env(var, 0), "REDIS_URL": BROKER, "DATABASE_URL": _database_url()}
    log = open(var / "worker.log", "w")  # noqa: SIM115 - the child keeps it
    argv = [sys.executable, "-m", "celery", "-A", "starforge", "worker", "--concurrency", "1"]
    argv += ["-I", "tests.e2e.backend_task", "--loglevel", "INFO"]
    argv += ["--without-mingle", "--without-gossip"]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _pids(client: redis.Redis) -> list[int]:
    return [json.loads(raw)["pid"] for raw in client.lrange(RUNS_KEY, 0, -1)]


def _run(app: Celery, client: redis.Redis, var: Path) -> int:
    """Send the task once and wait for its run: the backend that served it."""
    before = len(_pids(client))
    app.send_task(TASK)
    pids = wait_until(
        lambda: _pids(client) if len(_pids(client)) > before else None,
        30,
        f"the task to run (worker log: {(var / 'worker.log').read_text()[-2000:]})",
    )
    return pids[-1]


def test_a_worker_keeps_its_session_between_tasks_and_replaces_a_broken_one(tmp_path: Path):
    if connection.vendor != "postgresql":
        pytest.skip("sessions are PostgreSQL's")
    client = redis.Redis.from_url(BROKER)
    client.flushdb()
    app = Celery("sender", broker=BROKER)
    worker = _worker(tmp_path)
    try:
        wait_until(lambda: "ready." in (tmp_path / "worker.log").read_text(), 60, "the worker")
        first = [_run(app, client, tmp_path) for _ in range(6)]
        # The pool's few sessions serve task after task, each used again: not one per task. When
        # it opens its second is up to the pool's timing (under the suite's parallel load, once
        # at the third task, at normal priority and niced alike), so the bound is on how many.
        assert len(set(first)) <= 3, f"sessions for 6 tasks: {first}"
        with connection.cursor() as cursor:
            for pid in set(first):
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        after = [_run(app, client, tmp_path) for _ in range(6)]
        assert not set(after) & set(first)
        assert len(set(after)) <= 3, f"sessions for 6 tasks after the restart: {after}"
    finally:
        kill_group(worker)
        client.flushdb()
