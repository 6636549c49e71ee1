"""A task held by a worker that is SIGKILLed runs again on another worker within a minute, and a
worker lives through a restart of Redis.

Two real Celery workers on the project's settings (acks late, the broker's visibility timeout
and restore sweep of starforge.settings) and a real Redis: worker A takes a task that holds it,
worker B starts, A's whole process group is killed as a crashed host would be, and B must run
the task within SF_TASK_VISIBILITY_S plus its sweep (about 50 s), not Redis' default hour.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from celery import Celery
from django.conf import settings

from tests.e2e.held_task import RUNS_KEY
from tests.e2e.stack import REDIS_URL, ROOT, Redis, kill_group, stack_env, wait_until

pytestmark = pytest.mark.e2e
DB = 14  # this test's own Redis database: its queue holds nothing of other tests
WITHIN_S = 65  # the visibility timeout (45 s), the 5 s sweep, a worker's start, slack


def _own_db(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{DB}"))


BROKER = _own_db(REDIS_URL)


def _worker(var: Path, name: str, broker: str = BROKER, concurrency: int = 1) -> subprocess.Popen:
    env = {**stack_env(var, 0), "REDIS_URL": broker, "SF_TEST_WORKER": name}
    log = open(var / f"worker-{name}.log", "w")  # noqa: SIM115 - the child keeps it
    argv = [sys.executable, "-m", "celery", "-A", "starforge", "worker"]
    argv += ["--concurrency", str(concurrency)]
    argv += ["-I", "tests.e2e.held_task", "-n", f"{name}@%h", "--loglevel", "INFO"]
    argv += ["--without-mingle", "--without-gossip"]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _runs(client: redis.Redis) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(RUNS_KEY, 0, -1)]


def _ready(var: Path, name: str) -> bool:
    return "ready." in (var / f"worker-{name}.log").read_text()


def test_a_task_held_by_a_killed_worker_runs_again_within_a_minute(tmp_path: Path) -> None:
    assert settings.SF_TASK_VISIBILITY_S == 45  # the promise under test, not an override
    client = redis.Redis.from_url(BROKER)
    client.flushdb()
    app = Celery("sender", broker=BROKER)
    first = _worker(tmp_path, "a")
    second = None
    try:
        wait_until(lambda: _ready(tmp_path, "a"), 60, "worker a to start")
        app.send_task("tests.e2e.held_task.hold", args=[600.0])
        wait_until(lambda: _runs(client) or None, 30, "worker a to start the task")
        assert [run["worker"] for run in _runs(client)] == ["a"]
        second = _worker(tmp_path, "b")
        wait_until(lambda: _ready(tmp_path, "b"), 60, "worker b to start")
        killed_at = time.time()
        kill_group(first, signal.SIGKILL)
        runs = wait_until(
            lambda: _runs(client) if len(_runs(client)) > 1 else None,
            WITHIN_S + 30,
            "the task to run again on worker b",
        )
        assert [run["worker"] for run in runs] == ["a", "b"]
        assert runs[1]["at"] - killed_at <= WITHIN_S, runs
    finally:
        kill_group(first, signal.SIGKILL)
        if second is not None:
            kill_group(second, signal.SIGKILL)
        client.flushdb()
        client.close()


def test_a_worker_lives_through_a_restart_of_its_broker_while_it_holds_tasks(
    tmp_path: Path,
) -> None:
    """Redis restarts (a failover, an upgrade) while the worker holds a running task and a
    countdown one, both unacked: the worker reconnects and takes new tasks. A Celery 5.7.0 worker
    died here ("Unrecoverable error", exit 1) as it closed the lost connection, which is why
    requirements.txt keeps Celery at 5.6: a worker gone stalls the scheduler and the reconciler
    (the chaos test saw it: jobs left RUNNING and QUEUED until its deadline)."""
    broker = Redis()
    broker.start()
    app = Celery("sender", broker=broker.url)
    worker = _worker(tmp_path, "a", broker.url, concurrency=2)
    try:
        wait_until(lambda: _ready(tmp_path, "a"), 60, "the worker to start")
        client = redis.Redis.from_url(broker.url)
        app.send_task("tests.e2e.held_task.hold", args=[3.0])
        app.send_task("tests.e2e.held_task.hold", args=[0.0], countdown=60)
        wait_until(lambda: _runs(client) or None, 30, "the worker to start the task")
        log_text = (tmp_path / "worker-a.log").read_text
        wait_until(lambda: log_text().count(" received") == 2, 30, "both tasks to be held")
        client.close()
        broker.kill()
        time.sleep(1.0)
        broker.start()  # the same port, empty: no persistence
        client = redis.Redis.from_url(broker.url)
        sent = time.time()
        app.send_task("tests.e2e.held_task.hold", args=[0.0])

        def taken() -> list[dict] | None:
            assert worker.poll() is None, (tmp_path / "worker-a.log").read_text()[-6000:]
            return [run for run in _runs(client) if run["at"] >= sent] or None

        assert len(wait_until(taken, 60, "the worker to take a task sent after the restart")) == 1
        client.close()
    finally:
        kill_group(worker, signal.SIGKILL)
        broker.kill()
