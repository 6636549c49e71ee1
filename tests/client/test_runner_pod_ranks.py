"""A runner of one rank of a multi-node job (a Kubernetes pod: the engine puts SF_NODE_RANK in
the runner's environment): it spends the bootstrap credential for its rank, the job sees its
rank contract, and only rank 0's runner ships logs, metrics and the start report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from sf.contract import rank_env

from tests.client.helpers import exit_record, run_runner, runner_env

PRINT_RANK = "import os; print('rank', os.environ['NODE_RANK'], os.environ['MASTER_ADDR'])"


def pod_env(fake_api: Any, tmp_path: Path, rank: int) -> dict[str, str]:
    fake_api.route("POST /api/v1/ingest/token", lambda r: (200, {"token": "real-token"}))
    fake_api.route("POST /api/v1/ingest/logs", lambda r: (200, {"next_seq": 1}))
    fake_api.route("POST /api/v1/ingest/started", lambda r: (200, {"start_time": None}))
    fake_api.route("POST /api/v1/ingest/metrics", lambda r: (200, {"next_seq": 1}))
    env = runner_env(tmp_path, fake_api.url, "", [sys.executable, "-c", PRINT_RANK])
    del env["SF_JOB_TOKEN"]
    env["SF_BOOTSTRAP_TOKEN"] = "boot-token"
    env["SF_USER_ENV"] = json.dumps({"SEED": "1"})
    env.update(rank_env(rank, 2, 1, ["job-0.job", "job-1.job"], 29500))
    return env


@pytest.mark.parametrize("rank", [0, 1])
def test_the_exchange_names_the_pods_rank_and_the_job_sees_its_contract(
    fake_api: Any, tmp_path: Path, rank: int
) -> None:
    env = pod_env(fake_api, tmp_path, rank)
    result = run_runner(env)
    assert result.returncode == 0, result.stderr
    exchange = [r.json() for r in fake_api.requests if r.path == "/api/v1/ingest/token"]
    assert exchange == [{"attempt": 1, "rank": rank}]
    assert f"rank {rank} job-0.job" in result.stdout.splitlines()  # its pod log: no mark
    assert exit_record(env)["exit_code"] == 0


def test_only_rank_0s_runner_ships_and_reports_the_start(fake_api: Any, tmp_path: Path) -> None:
    zero, one = tmp_path / "zero", tmp_path / "one"
    zero.mkdir()
    one.mkdir()
    assert run_runner(pod_env(fake_api, one, 1)).returncode == 0
    sent = {r.path for r in fake_api.requests}
    assert sent == {"/api/v1/ingest/token"}  # rank 1: its code, and nothing more
    fake_api.requests.clear()
    assert run_runner(pod_env(fake_api, zero, 0)).returncode == 0
    logs = [r.json() for r in fake_api.requests if r.path == "/api/v1/ingest/logs"]
    assert [ln["rank"] for body in logs for ln in body["lines"]] == [0]
    assert "/api/v1/ingest/started" in {r.path for r in fake_api.requests}
