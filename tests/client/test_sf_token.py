"""`sf token create|list|revoke` against the fake API: what is sent, what is printed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.client.helpers import FakeApi, run_cli

TOKEN = {
    "id": 3,
    "name": "laptop",
    "prefix": "sf_abcdefg",
    "created_at": "2026-11-29T13:00:00Z",
    "last_used_at": None,
    "expires_at": "2026-12-29T13:00:00Z",
    "revoked_at": None,
}


@pytest.fixture
def api(fake_api: FakeApi, sf_env: Any) -> FakeApi:
    sf_env(fake_api.url)
    return fake_api


def test_create_sends_name_and_expiry_and_prints_the_secret_once(
    api: FakeApi, capsys: pytest.CaptureFixture
) -> None:
    api.route("POST /api/v1/tokens", lambda r: (201, {**TOKEN, "secret": "sf_abcdefgSECRET"}))
    assert run_cli(["token", "create", "--name", "laptop", "--expires-in-days", "30"]) == 0
    assert api.requests[-1].json() == {"name": "laptop", "expires_in_days": 30}
    out, err = capsys.readouterr()
    assert out.count("sf_abcdefgSECRET") == 1
    assert "created token 3 'laptop' (expires: 2026-12-29 13:00)" in out
    assert "will not be shown again" in err


def test_create_defaults_to_the_name_cli_and_no_expiry(
    api: FakeApi, capsys: pytest.CaptureFixture
) -> None:
    answer = {**TOKEN, "name": "cli", "expires_at": None, "secret": "sf_x"}
    api.route("POST /api/v1/tokens", lambda r: (201, answer))
    assert run_cli(["token", "create"]) == 0
    assert api.requests[-1].json() == {"name": "cli", "expires_in_days": None}
    assert "(expires: never)" in capsys.readouterr().out


def test_create_json_prints_the_answer(api: FakeApi, capsys: pytest.CaptureFixture) -> None:
    api.route("POST /api/v1/tokens", lambda r: (201, {**TOKEN, "secret": "sf_x"}))
    assert run_cli(["token", "create", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["secret"] == "sf_x"


def test_create_refused_prints_the_servers_sentence(
    api: FakeApi, capsys: pytest.CaptureFixture
) -> None:
    detail = "expires_in_days must be between 1 and 3650, got 0"
    api.route("POST /api/v1/tokens", lambda r: (400, {"detail": detail}))
    assert run_cli(["token", "create", "--expires-in-days", "0"]) == 1
    assert capsys.readouterr().err == f"error: {detail}\n"


def test_list_prints_a_table(api: FakeApi, capsys: pytest.CaptureFixture) -> None:
    revoked = {**TOKEN, "id": 2, "name": "old", "revoked_at": "2026-11-01T09:30:00Z"}
    api.route("GET /api/v1/tokens", lambda r: (200, [TOKEN, revoked]))
    assert run_cli(["token", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "PREFIX", "CREATED", "LAST", "USED", "EXPIRES"] + [
        "REVOKED"
    ]
    assert lines[1].split()[:3] == ["3", "laptop", "sf_abcdefg"]
    assert "never" in lines[1] and "2026-12-29 13:00" in lines[1]
    assert lines[2].split()[:2] == ["2", "old"] and "2026-11-01 09:30" in lines[2]


def test_list_json(api: FakeApi, capsys: pytest.CaptureFixture) -> None:
    api.route("GET /api/v1/tokens", lambda r: (200, [TOKEN]))
    assert run_cli(["token", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [TOKEN]


def test_revoke_sends_delete(api: FakeApi, capsys: pytest.CaptureFixture) -> None:
    api.route("DELETE /api/v1/tokens/3", lambda r: (204, b""))
    assert run_cli(["token", "revoke", "3"]) == 0
    assert api.requests[-1].method == "DELETE"
    assert capsys.readouterr().out == "token 3 revoked\n"


def test_revoke_someone_elses_token_says_no_such_token(
    api: FakeApi, capsys: pytest.CaptureFixture
) -> None:
    api.route("DELETE /api/v1/tokens/9", lambda r: (404, {"detail": "no such token"}))
    assert run_cli(["token", "revoke", "9"]) == 1
    assert capsys.readouterr().err == "error: no such token\n"


def test_revoke_needs_a_numeric_id(api: FakeApi) -> None:
    assert run_cli(["token", "revoke", "abc"]) == 2
    assert run_cli(["token", "revoke"]) == 2


def test_token_alone_shows_help(api: FakeApi, capsys: pytest.CaptureFixture) -> None:
    assert run_cli(["token"]) == 2
    assert "create" in capsys.readouterr().err
