"""Per-installation secrets: nothing committed to the repository signs or signs in anyone.

The embedded default used to sign sessions and job tokens with a string from the repository, so
anyone who read the source could forge a job token for any job, and everyone knew demo/demo.
Now each installation makes its own secret key (SF_VAR_DIR/secret-key, 0600) and its own demo
password on first start.
"""

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core import signing
from django.test import Client, override_settings

from jobs.bootstrap import ensure_demo
from jobs.management.commands.runstack import Command as RunStack
from jobs.models import Attempt
from tests.api_helpers import assert_refused, submit
from tests.ingesting import attach_attempt

ROOT = Path(__file__).resolve().parents[2]
OLD_KEY = "dev-only-insecure-key-change-me-in-production"  # the key once committed here
PRINT_KEY = "from django.conf import settings; print(settings.SECRET_KEY)"


def settings_key(var: Path, umask: int = 0o022, **env: str) -> subprocess.Popen:
    """A fresh process importing the embedded-default settings with SF_VAR_DIR=var."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SF_")}
    return subprocess.Popen(
        [sys.executable, "-c", PRINT_KEY],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "starforge.settings", "SF_VAR_DIR": str(var), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.umask(umask),
    )


def key_of(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.strip().splitlines()[-1]


# -- the secret key --------------------------------------------------------------------------------


def test_without_sf_secret_key_the_settings_make_a_key_of_their_own(tmp_path):
    var = tmp_path / "not-yet" / "var"  # made when missing
    key = key_of(settings_key(var, umask=0))  # 0600 whatever the umask
    path = var / "secret-key"
    assert key != OLD_KEY and OLD_KEY not in key
    assert len(key) >= 50 and len(set(key)) > 20
    assert path.read_text().strip() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key_of(settings_key(var)) == key  # stable across starts


def test_processes_starting_at_once_agree_on_one_key(tmp_path):
    procs = [settings_key(tmp_path) for _ in range(8)]
    keys = {key_of(proc) for proc in procs}
    assert keys == {(tmp_path / "secret-key").read_text().strip()}


def test_each_installation_gets_another_key(tmp_path):
    assert key_of(settings_key(tmp_path / "a")) != key_of(settings_key(tmp_path / "b"))


def test_sf_secret_key_wins_and_no_file_is_written(tmp_path):
    given = "x" * 30 + "0123456789abcdefghijABCDEFGHIJ"
    assert key_of(settings_key(tmp_path, SF_SECRET_KEY=given)) == given
    assert not (tmp_path / "secret-key").exists()


def test_a_truncated_key_file_stops_the_start_with_a_sentence(tmp_path):
    (tmp_path / "secret-key").write_text("short\n")
    proc = settings_key(tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "holds fewer than 50 characters" in err


def test_this_process_does_not_run_on_the_committed_key(settings):
    assert settings.SECRET_KEY != OLD_KEY


@pytest.mark.django_db
def test_a_job_token_signed_with_the_committed_key_is_refused(api):
    job_id = submit(api)
    attach_attempt(job_id, 1)
    nonce = Attempt.objects.get(job_id=job_id, number=1).token_nonce
    old = signing.Signer(key=OLD_KEY, salt="starforge.job-token")
    for payload in (f"{job_id}.1", f"{job_id}.1.{nonce}"):
        forged = Client(HTTP_AUTHORIZATION=f"Bearer {old.sign(payload)}")
        for path in ("/api/v1/ingest/started", "/api/v1/ingest/logs"):
            assert_refused(forged.post(path, {"attempt": 1}, "application/json"), 401)


@pytest.mark.django_db
def test_a_session_signed_with_the_committed_key_is_refused(alice):
    client = Client()
    with override_settings(SECRET_KEY=OLD_KEY):
        client.force_login(alice)
        assert client.get("/api/v1/me").status_code == 200  # what a forger got
    assert_refused(client.get("/api/v1/me"), 401)
    assert client.get("/").status_code == 302  # to the sign-in page


# -- the demo password -----------------------------------------------------------------------------


@pytest.fixture
def var(settings, tmp_path):
    settings.VAR_DIR = tmp_path / "var"
    return settings.VAR_DIR


@pytest.mark.django_db
def test_the_demo_password_is_this_installations_own_and_kept_0600(var):
    demo = ensure_demo()
    user = User.objects.get(username="demo")
    assert demo.password and demo.password != "demo" and len(demo.password) >= 16
    assert user.check_password(demo.password) and not user.check_password("demo")
    path = var / "demo-password"
    assert path.read_text().strip() == demo.password
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((var / "demo-token").stat().st_mode) == 0o600


@pytest.mark.django_db
def test_the_demo_password_is_not_reset_at_each_start(var):
    first = ensure_demo().password
    hashed = User.objects.get(username="demo").password
    assert ensure_demo().password == first
    assert User.objects.get(username="demo").password == hashed


@pytest.mark.django_db
def test_a_demo_password_someone_changed_is_kept_and_not_printed(var):
    ensure_demo()
    user = User.objects.get(username="demo")
    user.set_password("my-own-choice")
    user.save()
    assert ensure_demo().password is None
    assert User.objects.get(username="demo").check_password("my-own-choice")


@pytest.mark.django_db
def test_an_older_installation_still_on_demo_demo_gets_its_own_password(var):
    User.objects.create_user("demo", password="demo", is_staff=True)
    demo = ensure_demo()
    assert demo.password and demo.password != "demo"
    assert not User.objects.get(username="demo").check_password("demo")


@pytest.mark.django_db
def test_the_banner_prints_the_password_with_the_sf_login_line(var):
    demo = ensure_demo()
    out = io.StringIO()
    command = RunStack(stdout=out)
    command._banner("127.0.0.1", 8000, 8001, 4, demo)
    lines = out.getvalue().splitlines()
    login = next(n for n, line in enumerate(lines) if "sf login --url" in line)
    near = "\n".join(lines[max(0, login - 3) : login + 1])
    assert f"as demo, password {demo.password}" in near
    assert "demo/demo" not in out.getvalue() and "password demo " not in out.getvalue()
