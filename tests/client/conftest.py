"""Fixtures for the client tests: a stdlib fake API server (`tests.client.helpers.FakeApi`)
serving in a thread, the CLI's config pointed away from the user's, and `sf` against a live
Starforge. No Django, no database, no network but for `sf`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.client.helpers import FakeApi, run_cli


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    api = FakeApi()
    thread = threading.Thread(target=api.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield api
    api.server.shutdown()
    api.server.server_close()


@pytest.fixture
def sf_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Callable[[str], None]:
    """Point the CLI at a throwaway config file; call it with a URL to log in via env."""
    monkeypatch.setenv("SF_CONFIG", str(tmp_path / "sf-config.json"))
    monkeypatch.delenv("SF_URL", raising=False)
    monkeypatch.delenv("SF_TOKEN", raising=False)

    def login(url: str) -> None:
        monkeypatch.setenv("SF_URL", url)
        monkeypatch.setenv("SF_TOKEN", "tok")

    return login


@pytest.fixture
def sf(live_server, alice, monkeypatch, tmp_path, capsys) -> Callable[..., tuple[int, str, str]]:
    """`sf ARGS` as alice against the live server (a real Starforge): (exit code, stdout,
    stderr). Tests using it need `django_db(transaction=True)`: the server reads what they
    wrote."""
    from jobs.actions.tokens import issue_token

    monkeypatch.setenv("SF_CONFIG", str(tmp_path / "sf.json"))
    monkeypatch.setenv("SF_URL", live_server.url)
    monkeypatch.setenv("SF_TOKEN", issue_token(alice))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run_cli(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
