"""`sf job attempts ID` and `sf usage export` against the fake API: what they ask, what they
print."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest

from tests.client.helpers import FakeApi, run_cli

ATTEMPTS = [
    {
        "number": 1,
        "job_ref": "4711",
        "native_state": "CANCELLED",
        "engine_start": "2026-12-07T10:00:00Z",
        "engine_end": "2026-12-07T10:05:00Z",
        "start_time": "2026-12-07T10:00:00Z",
        "end_time": "2026-12-07T10:04:59.620Z",
        "total_gpus": 2,
        "gpu_seconds": 599.24,
        "failure": "",
        "end_reason": "paused by alice",
    },
    {
        "number": 2,
        "job_ref": "4712",
        "native_state": "COMPLETED",
        "engine_start": "2026-12-07T10:06:00Z",
        "engine_end": "2026-12-07T10:07:00Z",
        "start_time": "2026-12-07T10:06:00Z",
        "end_time": "2026-12-07T10:06:59.970Z",
        "total_gpus": 2,
        "gpu_seconds": 119.94,
        "failure": "",
        "end_reason": "succeeded",
    },
]
CSV = "JobID,Attempt,User\n7,1,alice\n7,2,alice\n"


@pytest.fixture
def api(fake_api: FakeApi, sf_env: Any) -> FakeApi:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/jobs/7/attempts", lambda r: (200, ATTEMPTS))
    fake_api.route("GET /api/v1/usage/export", lambda r: (200, CSV.encode()))
    return fake_api


def test_attempts_lists_engine_ids_states_and_both_times(
    api: FakeApi, capsys: pytest.CaptureFixture
) -> None:
    assert run_cli(["job", "attempts", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["#", "ENGINE", "ID", "STATE"]
    first = lines[1].split()
    assert first[:3] == ["1", "4711", "CANCELLED"]
    assert first[3:11] == [
        "2026-12-07", "10:00:00", "2026-12-07", "10:05:00",
        "2026-12-07", "10:00:00", "2026-12-07", "10:04:59.620",
    ]  # fmt: skip
    assert first[11:13] == ["2", "599.240"] and "paused by alice" in lines[1]
    assert lines[2].split()[:3] == ["2", "4712", "COMPLETED"]


def test_attempts_json_is_the_apis_answer(api: FakeApi, capsys: pytest.CaptureFixture) -> None:
    assert run_cli(["job", "attempts", "7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == ATTEMPTS


def test_usage_export_writes_the_servers_csv_as_it_is(
    api: FakeApi, capsysbinary: pytest.CaptureFixture
) -> None:
    assert run_cli(["usage", "export", "--start", "2026-12-01", "--end", "2026-12-08"]) == 0
    assert api.requests[-1].query == {"start": "2026-12-01", "end": "2026-12-08", "format": "csv"}
    out = capsysbinary.readouterr().out.decode()
    assert [row["Attempt"] for row in csv.DictReader(io.StringIO(out))] == ["1", "2"]
