"""`sf usage` against the fake API: the query it sends, the table and total it prints."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.client.helpers import FakeApi, run_cli

ANSWER = {
    "since": "2026-11-01",
    "until": "2026-11-30",
    "by": "user",
    "rows": [
        {"user": "alice", "gpu_seconds": 7200.0, "gpu_hours": 2.0, "borrowed_gpu_hours": 0.0},
        {"user": "bob", "gpu_seconds": 45000.0, "gpu_hours": 12.5, "borrowed_gpu_hours": 4.25},
    ],
    "total_gpu_seconds": 52200.0,
    "total_gpu_hours": 14.5,
}


@pytest.fixture
def api(fake_api: FakeApi, sf_env: Any) -> FakeApi:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/usage", lambda r: (200, ANSWER))
    return fake_api


def test_usage_sends_the_filters_and_prints_a_table_with_the_total(
    api: FakeApi, capsys: pytest.CaptureFixture
) -> None:
    assert run_cli(["usage", "--team", "vision", "--since", "2026-11-01", "--by", "user"]) == 0
    assert api.requests[-1].query == {"team": "vision", "since": "2026-11-01", "by": "user"}
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "GPU usage 2026-11-01 to 2026-11-30 (UTC, until excluded)"
    assert lines[1].split() == ["USER", "GPU-HOURS", "GPU-SECONDS", "BORROWED", "GPU-HOURS"]
    assert lines[2].split() == ["alice", "2.00", "7,200", "0.00"]
    assert lines[3].split() == ["bob", "12.50", "45,000", "4.25"]
    assert lines[-1].split() == ["TOTAL", "14.50", "52,200", "4.25"]


def test_usage_defaults_to_by_team_and_lets_the_server_pick_the_days(
    api: FakeApi, capsys: pytest.CaptureFixture
) -> None:
    assert run_cli(["usage"]) == 0
    assert api.requests[-1].query == {"by": "team"}


def test_usage_json_prints_the_answer(api: FakeApi, capsys: pytest.CaptureFixture) -> None:
    assert run_cli(["usage", "--json", "--by", "user"]) == 0
    assert json.loads(capsys.readouterr().out) == ANSWER


def test_usage_refused_prints_the_servers_sentence(
    api: FakeApi, capsys: pytest.CaptureFixture
) -> None:
    detail = "team nlp does not exist or you are not in it"
    api.route("GET /api/v1/usage", lambda r: (404, {"detail": detail}))
    assert run_cli(["usage", "--team", "nlp"]) == 1
    assert capsys.readouterr().err == f"error: {detail}\n"


def test_usage_rejects_an_unknown_grouping(api: FakeApi, capsys: pytest.CaptureFixture) -> None:
    assert run_cli(["usage", "--by", "week"]) == 2
    assert api.requests == []


def test_usage_by_gpu_type_names_the_typeless_usage(
    api: FakeApi, capsys: pytest.CaptureFixture
) -> None:
    rows = [
        {"gpu_type": "", "gpu_seconds": 3600.0, "gpu_hours": 1.0, "borrowed_gpu_hours": 0.0},
        {"gpu_type": "a100", "gpu_seconds": 7200.0, "gpu_hours": 2.0, "borrowed_gpu_hours": 0.0},
    ]
    answer = {**ANSWER, "by": "gpu_type", "rows": rows}
    api.route("GET /api/v1/usage", lambda r: (200, answer))
    assert run_cli(["usage", "--by", "gpu_type"]) == 0
    assert api.requests[-1].query == {"by": "gpu_type"}
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ["any", "type", "1.00", "3,600", "0.00"]
    assert lines[3].split() == ["a100", "2.00", "7,200", "0.00"]
