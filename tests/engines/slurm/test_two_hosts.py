"""Two server hosts with no shared directory, one of them killed mid-job.

Host A and host B each run an API server and a Celery worker with a `SF_VAR_DIR` of their own;
they share only what a multi-host deployment shares: one PostgreSQL ledger, one Redis, the S3
server (`rclone serve s3`, real) holding snapshots and logs, and the real Slurm of this suite.
Runners reach the API through a small TCP balancer in front of both servers (what the
production proxy does), which prefers A while A answers.

The job is submitted through A and launched by A's worker (B's starts later); its log is read
live through B while it is written through A; then A's API server and worker are SIGKILLed.
The job must still end SUCCEEDED, every line exactly once, and its GPU-seconds those of its one
attempt's run, as check_ledger and check_usage agree.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from starforge.serving import web_server_argv
from tests.e2e.stack import (
    REDIS_URL,
    ROOT,
    free_port,
    kill_group,
    sf_command,
    spawn_logged,
    wait_until,
)
from tests.engines.slurm.conftest import slurm
from tests.s3 import s3_url

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.postgres]
LINES = 240
JOB = f"""\
import time

for i in range({LINES}):
    print(f"line {{i}}", flush=True)
    time.sleep(0.1)
"""
PG_ADMIN = os.environ.get("SF_TEST_PG_ADMIN", "postgres://postgres@127.0.0.1:5432/postgres")


class Balancer:
    """A TCP forwarder to the first backend that accepts a connection, in order."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.used: dict[int, int] = dict.fromkeys(backends, 0)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        for port in self.backends:
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                continue
            self.used[port] += 1
            _pipe(client, upstream)
            return
        client.close()


def _pipe(one: socket.socket, other: socket.socket) -> None:
    with one, other:
        while True:
            ready, _, _ = select.select([one, other], [], [], 60)
            if not ready:
                return
            for sock in ready:
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                (other if sock is one else one).sendall(data)


class Host:
    """One server host: an API server and a Celery worker with their own SF_VAR_DIR."""

    def __init__(self, name: str, var: Path, env: dict[str, str]) -> None:
        self.name = name
        self.var = var
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**env, "SF_VAR_DIR": str(var), "SF_PORT": str(self.port)}
        self.procs: dict[str, subprocess.Popen] = {}

    def start_api(self) -> None:
        self._spawn("api", *web_server_argv("127.0.0.1", self.port, workers=2)[1:])

    def start_worker(self) -> None:
        self._spawn(
            "worker",
            *("-m", "celery", "-A", "starforge", "worker", "-n", f"{self.name}@%h"),
            *("--loglevel", "INFO"),
        )

    def start_beat(self) -> None:
        self._spawn("beat", "-m", "celery", "-A", "starforge", "beat", "-s", str(self.var / "beat"))

    def kill(self) -> None:
        """SIGKILL every process of this host, as a host that died would leave them."""
        while self.procs:
            kill_group(self.procs.popitem()[1], signal.SIGKILL)

    def close(self) -> None:
        while self.procs:
            kill_group(self.procs.popitem()[1])

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"manage.py {args}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def logs(self) -> str:
        return "\n".join(
            f"----- {self.name}/{log.name}\n" + "\n".join(log.read_text().splitlines()[-30:])
            for log in sorted(self.var.glob("*.log"))
        )

    def _spawn(self, what: str, *args: str) -> None:
        self.procs[what] = spawn_logged(self.var / f"{what}.log", self.env, *args)


@pytest.fixture
def ledger() -> Iterator[str]:
    """A PostgreSQL database of this test's own, dropped at the end."""
    name = f"sf_two_hosts_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _api(url: str, token: str, path: str) -> dict:
    request = urllib.request.Request(
        f"{url}/api/v1{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _lines(url: str, token: str, job_id: int) -> list[str]:
    """Every stored line of the job, paged through `url`'s log API."""
    texts: list[str] = []
    cursor = ""
    while True:
        page = _api(url, token, f"/jobs/{job_id}/logs?limit=5000&cursor={cursor}")
        texts += [line["text"] for line in page["lines"]]
        if not page["lines"]:
            return texts
        cursor = page["cursor"]


def _two_hosts(
    tmp_path: Path, ledger: str, s3_server: str, slurm_conf: str
) -> tuple[Host, Host, Balancer, str]:
    """Hosts A and B on one ledger, Redis and bucket behind a balancer that prefers A, a Slurm
    cluster that is the demo team's default, and the demo token; nothing started yet."""
    redis_db = REDIS_URL.rsplit("/", 1)[0] + "/13"
    shared = {
        **os.environ,
        "DATABASE_URL": ledger,
        "REDIS_URL": redis_db,
        "SF_STORAGE_URL": s3_url(s3_server, f"two-hosts-{uuid.uuid4().hex[:8]}"),
        "SF_SECRET_KEY": "two-hosts-" + uuid.uuid4().hex * 2,
        "PYTHONUNBUFFERED": "1",
    }
    shared.pop("SF_OUTPUT_ROOT", None)
    a = Host("a", tmp_path / "host-a", shared)
    b = Host("b", tmp_path / "host-b", shared)
    for host in (a, b):
        host.var.mkdir()
    balancer = Balancer([a.port, b.port])
    a.manage("migrate", "--no-input", "-v", "0")
    token = a.manage(
        "shell", "-c", "from jobs.bootstrap import ensure_demo as e; print(e().token)"
    ).split()[-1]
    a.manage(
        "cluster",
        "add",
        "slurm",
        "--kind",
        "slurm",
        f"--set=slurm_conf={json.dumps(slurm_conf)}",
        f"--set=api_url={json.dumps(f'http://127.0.0.1:{balancer.port}')}",
        "--default-for",
        "demo",
    )
    subprocess.run(
        [sys.executable, "-m", "celery", "-A", "starforge", "purge", "-f"],
        cwd=ROOT,
        env=a.env,
        capture_output=True,
        timeout=60,
    )
    return a, b, balancer, token


def test_a_job_survives_the_loss_of_one_of_two_hosts(
    tmp_path: Path, ledger: str, s3_server: str, slurm_conf: str, idle_gpus
) -> None:
    a, b, balancer, token = _two_hosts(tmp_path, ledger, s3_server, slurm_conf)
    project = tmp_path / "project"
    project.mkdir()
    (project / "count.py").write_text(JOB)
    sf = sf_command(project, tmp_path / "sf.json")

    refs: list[str] = []

    def diagnose() -> str:
        return a.logs() + "\n" + b.logs()

    try:
        a.start_api()
        b.start_api()
        a.start_worker()
        b.start_beat()
        for host in (a, b):
            wait_until(lambda h=host: _answers(h.url, token), 60, f"host {host.name}'s API")
        sf("login", "--url", a.url, "--token", token)
        job_id = json.loads(
            sf("submit", "--json", "--gpus", "1", "--", "python", "count.py").stdout
        )["id"]
        wait_until(
            lambda: _api(b.url, token, f"/jobs/{job_id}")["status"] == "RUNNING",
            120,
            "the job to run",
            diagnose,
        )
        refs.append(_api(b.url, token, f"/jobs/{job_id}")["job_ref"])
        # Written through A (the balancer prefers it), read live through B.
        wait_until(lambda: len(_lines(b.url, token, job_id)) >= 30, 60, "lines via B", diagnose)
        assert balancer.used[a.port] > 0 and balancer.used[b.port] == 0
        b.start_worker()
        wait_until(lambda: "ready" in (b.var / "worker.log").read_text(), 60, "B's worker")
        a.kill()  # the API server and worker of host A, mid-job
        killed_with = len(_lines(b.url, token, job_id))
        assert killed_with < LINES, "the job ended before host A was killed: make it longer"

        job = wait_until(
            lambda: (
                (j := _api(b.url, token, f"/jobs/{job_id}"))["status"]
                in {"SUCCEEDED", "FAILED", "STOPPED"}
                and j
            ),
            180,
            "the job to end",
            diagnose,
        )
        assert job["status"] == "SUCCEEDED", (job, diagnose())
        assert balancer.used[b.port] > 0  # the runner went on through B
        texts = _lines(b.url, token, job_id)
        assert texts == [f"line {i}" for i in range(LINES)], diagnose()
        attempts = _api(b.url, token, f"/jobs/{job_id}/attempts")
        assert len(attempts) == 1, attempts
        ran_s = attempts[0]["gpu_seconds"]
        assert LINES * 0.1 <= ran_s <= LINES * 0.1 + 30, attempts
        assert abs(job["gpu_seconds"] - ran_s) < 0.01, (job, attempts)
        b.manage("check_ledger")
        b.manage("check_usage")
        # Nothing of the job's bytes is on either host's disk: they are in the object store.
        for host in (a, b):
            assert not list(host.var.glob("logs/**/*.log")), host.name
            assert not list(host.var.glob("snapshots/**/*.tar.gz")), host.name
    finally:
        a.close()
        b.close()
        balancer.close()
        if refs:
            slurm("scancel", *refs, conf=slurm_conf, check=False)


def _answers(url: str, token: str) -> bool:
    try:
        return bool(_api(url, token, "/me"))
    except OSError:
        return False
