"""The production settings path: `check --deploy` is clean, and unsafe values stop the start."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = {
    "DJANGO_SETTINGS_MODULE": "starforge.settings_prod",
    "SF_SECRET_KEY": "k" * 20 + "0123456789abcdefghijABCDEFGHIJ-_",
    "SF_ALLOWED_HOSTS": "starforge.example.com",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
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


def test_check_deploy_reports_nothing():
    done = manage("check", "--deploy", "--fail-level", "WARNING", **GOOD)
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


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
