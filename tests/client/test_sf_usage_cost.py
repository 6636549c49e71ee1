"""`sf usage` shows each row's cost and the total in the server's currency (issue 50, point 4),
as the server wrote them (decimal strings, never re-computed by the client)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.client.helpers import FakeApi, run_cli

ANSWER = {
    "since": "2026-12-01",
    "until": "2026-12-08",
    "by": "team",
    "rows": [
        {
            "team": "vision",
            "gpu_seconds": 7200.0,
            "gpu_hours": 2.0,
            "borrowed_gpu_hours": 0.0,
            "cost": "5.10",
        },
    ],
    "total_gpu_seconds": 7200.0,
    "total_gpu_hours": 2.0,
    "total_cost": "5.10",
    "currency": "EUR",
}


def test_usage_prints_the_cost_column_and_its_total(
    fake_api: FakeApi, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/usage", lambda r: (200, ANSWER))
    assert run_cli(["usage"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-2:] == ["COST", "(EUR)"]
    assert lines[2].split() == ["vision", "2.00", "7,200", "0.00", "5.10"]
    assert lines[-1].split() == ["TOTAL", "2.00", "7,200", "0.00", "5.10"]
