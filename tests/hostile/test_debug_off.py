"""`make run` serves with DEBUG off; SF_DEBUG=1 turns it on for a developer (issue 47, point 12).

With DEBUG on by default, a request that failed showed Django's debug page (settings included)
and an anonymous request for a missing page listed every URL pattern. Off, the console's assets
are still served by the app and the default host still answers. The real `make run` is asked
for a missing page in tests/e2e/test_first_job_as_root.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASK = """
import json
from django.conf import settings
from django.test import Client
browser = Client(raise_request_exception=False)
missing = browser.get("/no-such-page/", HTTP_HOST="127.0.0.1:8000")
asset = browser.get("/static/vendor/plotly.min.js", HTTP_HOST="127.0.0.1:8000")
print(json.dumps({
    "debug": settings.DEBUG,
    "missing": [missing.status_code, missing.content.decode()],
    "asset": [asset.status_code, len(b"".join(asset.streaming_content))],
}))
"""


def as_make_run_serves(**env: str) -> dict:
    """What a server process on the default settings answers, with `env` added."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SF_")}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", ASK],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def served(tmp_path) -> dict:
    return as_make_run_serves(SF_VAR_DIR=str(tmp_path))


def test_debug_is_off_unless_a_developer_turns_it_on(served, tmp_path):
    assert served["debug"] is False
    assert as_make_run_serves(SF_VAR_DIR=str(tmp_path), SF_DEBUG="1")["debug"] is True


def test_a_missing_page_lists_no_url_pattern(served):
    status, page = served["missing"]
    assert status == 404
    assert "URLconf" not in page and "api/" not in page and "admin/" not in page


def test_the_consoles_assets_are_still_served_by_the_app_on_the_default_host(served):
    status, size = served["asset"]
    assert status == 200 and size > 1_000_000  # Plotly's bundle, from the app itself
