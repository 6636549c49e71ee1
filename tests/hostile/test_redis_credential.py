"""Redis asks for a credential by default (issue 47, point 2).

A job on the local executor shares the server's loopback: a Redis that lets anyone in gave it
another team's live log lines (`asgi:group:job-<id>`), the Celery workers' remote control and
FLUSHDB. Without REDIS_URL, every server process names the embedded Redis `make run` starts,
which asks for this installation's own password (made and kept like the secret key, 0600).
The production settings and `check --deploy` are in tests/deploy/test_settings_prod.py; `make
run` with and without REDIS_URL in tests/e2e/test_first_job_as_root.py and
tests/e2e/test_runstack_signals.py.
"""

import os
import secrets
import socket
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import redis

from jobs.management.commands.runstack import _embedded_redis

ROOT = Path(__file__).resolve().parents[2]
SHOW = (
    "from django.conf import settings; "
    "print(settings.REDIS_URL, settings.CELERY_BROKER_URL, "
    "settings.CHANNEL_LAYERS['default']['CONFIG']['hosts'][0], "
    "settings.CACHES['throttle']['LOCATION'])"
)


def settings_without_redis_url(var: Path, **env: str) -> list[str]:
    """The Redis URLs of the broker, the channel layer and the throttles, as a server process
    started without REDIS_URL sees them."""
    base = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith("SF_")}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", SHOW],
        cwd=ROOT,
        env={**base, "SF_VAR_DIR": str(var), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_redis_url_every_server_process_names_a_redis_that_asks_for_a_password(tmp_path):
    urls = settings_without_redis_url(tmp_path)
    kept = tmp_path / "redis-password"
    password = kept.read_text().strip()
    assert len(password) >= 32
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert urls == [f"redis://:{password}@127.0.0.1:6390/0"] * 4
    # The same password for every process of the installation, start after start.
    assert (
        settings_without_redis_url(tmp_path, SF_REDIS_PORT="6411")
        == [f"redis://:{password}@127.0.0.1:6411/0"] * 4
    )


def test_each_installation_has_a_password_of_its_own(tmp_path):
    one = settings_without_redis_url(tmp_path / "one")[0]
    other = settings_without_redis_url(tmp_path / "other")[0]
    assert one != other


class _NoStop:
    def check(self) -> None:
        pass


def test_the_embedded_redis_refuses_whoever_has_not_the_password(settings):
    port, password = free_port(), secrets.token_urlsafe(32)
    settings.REDIS_URL = f"redis://:{password}@127.0.0.1:{port}/0"
    proc = _embedded_redis(port, _NoStop())
    try:
        stranger = redis.Redis(host="127.0.0.1", port=port, protocol=2)
        with pytest.raises(redis.AuthenticationError):
            stranger.ping()
        with pytest.raises(redis.AuthenticationError):
            stranger.execute_command("FLUSHALL")
        assert redis.Redis(host="127.0.0.1", port=port, password=password).ping()
        # Not on its command line, which every local user (and job) can read.
        assert password not in " ".join(psutil.Process(proc.pid).cmdline())
    finally:
        proc.kill()
        proc.wait()
