"""The `sf` command line: usage errors, server errors, start-up imports, and each command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sf.commands import logs

from tests.client.helpers import JOB, run_cli


def test_sf_help_imports_no_rich() -> None:
    code = "import sys, sf.cli; print(sorted(m for m in sys.modules if m in ('rich', 'requests')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_submit_requires_command(sf_env: Any, capsys: pytest.CaptureFixture) -> None:
    assert run_cli(["submit", "--gpus", "1", "--"]) == 2
    assert "missing command" in capsys.readouterr().err


def test_submit_command_without_double_dash_is_usage_error(sf_env: Any) -> None:
    assert run_cli(["submit", "python", "train.py"]) == 2


def test_negative_gpus_is_usage_error(sf_env: Any, capsys: pytest.CaptureFixture) -> None:
    assert run_cli(["submit", "--gpus", "-1", "--", "python", "x.py"]) == 2
    assert "--gpus must be >= 0" in capsys.readouterr().err


def test_bad_env_pair_is_usage_error(sf_env: Any) -> None:
    assert run_cli(["submit", "--env", "NOEQUALS", "--", "true"]) == 2


def test_missing_login_is_a_clear_error(sf_env: Any, capsys: pytest.CaptureFixture) -> None:
    assert run_cli(["job", "status", "1"]) == 1
    assert "sf login" in capsys.readouterr().err


def test_server_detail_is_printed_as_error(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/jobs/5", lambda r: (404, {"detail": "Job 5 does not exist."}))
    assert run_cli(["job", "status", "5"]) == 1
    assert capsys.readouterr().err == "error: Job 5 does not exist.\n"


def test_unreachable_server_exits_3_naming_url(sf_env: Any, capsys: pytest.CaptureFixture) -> None:
    sf_env("http://127.0.0.1:9")
    assert run_cli(["job", "status", "1"]) == 3
    assert "cannot reach the Starforge server at http://127.0.0.1:9" in capsys.readouterr().err


def test_login_verifies_and_saves_config(
    fake_api: Any, sf_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    fake_api.route("GET /api/v1/me", lambda r: (200, {"username": "ada", "teams": ["vision"]}))
    assert run_cli(["login", "--url", fake_api.url, "--token", "secret"]) == 0
    assert capsys.readouterr().out == f"logged in to {fake_api.url} as ada (teams: vision)\n"
    assert json.loads((tmp_path / "sf-config.json").read_text())["token"] == "secret"
    assert fake_api.requests[0].headers["Authorization"] == "Bearer secret"


def test_submit_uploads_snapshot_then_creates_job(
    fake_api: Any, sf_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('hi')\n")
    fake_api.route("GET /api/v1/me", lambda r: (200, {"default_team": "vision"}))
    fake_api.route("POST /api/v1/snapshots", lambda r: (201, {"size": len(r.body)}))
    fake_api.route("POST /api/v1/jobs", lambda r: (201, {**JOB, "status": "PENDING"}))
    argv = [
        "submit",
        "--dir",
        str(tmp_path / "proj"),
        "--gpus",
        "0",
        "--env",
        "A=1",
        "B=x=y",
        "--pending-deadline",
        "60",
        "--",
        "python",
        "train.py",
        "--steps",
        "3",
    ]
    assert run_cli(argv) == 0
    me, upload, create = fake_api.requests
    assert (me.method, me.path) == ("GET", "/api/v1/me")
    assert upload.headers["Content-Type"] == "application/gzip"
    # The snapshot is uploaded for the team the job is submitted to (the default one here).
    assert upload.query == {"team": "vision"}
    body = create.json()
    assert body["team"] == "vision"
    assert body["entrypoint"] == ["python", "train.py", "--steps", "3"]
    assert body["env"] == {"A": "1", "B": "x=y"} and body["gpus_per_node"] == 0
    assert body["pending_deadline_s"] == 60 and body["cluster"] is None
    import hashlib

    assert body["snapshot"] == hashlib.sha256(upload.body).hexdigest()
    assert (
        capsys.readouterr().out == "submitted job 7 run_id r7 (PENDING)\nfollow it: sf job logs 7\n"
    )


def test_submit_with_a_team_uploads_the_snapshot_for_that_team(
    fake_api: Any, sf_env: Any, tmp_path: Path
) -> None:
    sf_env(fake_api.url)
    fake_api.route("POST /api/v1/snapshots", lambda r: (201, {"size": len(r.body)}))
    fake_api.route("POST /api/v1/jobs", lambda r: (201, JOB))
    assert run_cli(["submit", "--dir", str(tmp_path), "--team", "nlp lab", "--", "true"]) == 0
    upload, create = fake_api.requests  # no /me: the team is named
    assert upload.path == "/api/v1/snapshots" and upload.query == {"team": "nlp lab"}
    assert create.json()["team"] == "nlp lab"


def test_submit_sends_the_window_and_its_policy(fake_api: Any, sf_env: Any, tmp_path: Path) -> None:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/me", lambda r: (200, {"default_team": "vision"}))
    fake_api.route("POST /api/v1/snapshots", lambda r: (201, {"size": len(r.body)}))
    fake_api.route("POST /api/v1/jobs", lambda r: (201, JOB))
    argv = ["submit", "--dir", str(tmp_path), "--window", "nights", "--window-policy", "pause"]
    assert run_cli([*argv, "--", "true"]) == 0
    body = fake_api.requests[-1].json()
    assert (body["window"], body["window_policy"]) == ("nights", "pause")
    assert run_cli(["submit", "--window-policy", "sometimes", "--", "true"]) == 2


def test_status_without_id_shows_latest_job(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/jobs", lambda r: (200, {"items": [{"id": 7}]}))
    fake_api.route("GET /api/v1/jobs/7", lambda r: (200, JOB))
    assert run_cli(["job", "status"]) == 0
    out = capsys.readouterr().out
    assert fake_api.requests[0].query == {"mine": "true", "limit": "1"}
    assert "2 (virtual slots)" in out and "local (local)" in out and "run_id:" in out


def test_status_without_jobs_is_a_clear_error(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/jobs", lambda r: (200, {"items": []}))
    assert run_cli(["job", "status"]) == 1
    assert "no jobs yet" in capsys.readouterr().err


def test_list_all_drops_mine_filter(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/jobs", lambda r: (200, {"items": [JOB]}))
    fake_api.route("GET /api/v1/arrays", lambda r: (200, []))
    assert run_cli(["job", "list", "--all", "--status", "RUNNING"]) == 0
    assert fake_api.requests[0].query == {"status": "RUNNING", "limit": "20", "tasks": "false"}
    assert fake_api.requests[1].query == {"limit": "20"}
    assert "demo" in capsys.readouterr().out


def test_stop_posts_verb_and_prints_status(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    stopped = {**JOB, "status": "STOPPED", "status_reason": "stopped by ada"}
    fake_api.route("POST /api/v1/jobs/7/stop", lambda r: (200, stopped))
    assert run_cli(["job", "stop", "7"]) == 0
    assert capsys.readouterr().out == "job 7: STOPPED (stopped by ada)\n"


def test_logs_follow_until_done_and_split_streams(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    sf_env(fake_api.url)
    pages = [
        {"lines": [{"seq": 0, "stream": "stdout", "text": "a"}], "cursor": "c1", "done": False},
        {"lines": [], "cursor": "c1", "done": False},
        {
            "lines": [
                {"seq": 1, "stream": "stderr", "text": "oops"},
                {"seq": 2, "stream": "stdout", "text": "b"},
            ],
            "cursor": "c2",
            "done": True,
        },
    ]
    fake_api.route("GET /api/v1/jobs/7/logs", lambda r: (200, pages.pop(0)))
    assert run_cli(["job", "logs", "7"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("a\nb\n", "oops\n")
    queries = [r.query for r in fake_api.requests]
    follow = {"follow": "true", "wait": "20", "poll": "true", "limit": "50000"}
    assert queries == [
        {"tail": "50", **follow},
        {"cursor": "c1", **follow},
        {"cursor": "c1", **follow},
    ]


def test_logs_waits_as_long_as_the_server_says_before_following_again(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that may not hold a follow answers at once with poll_after_s: the CLI pauses
    that long (at most LOG_POLL_MAX_S) after an empty page, and not after one with lines."""
    sf_env(fake_api.url)
    pages = [
        {"lines": [], "cursor": "c0", "done": False, "poll_after_s": 1.0},
        {"lines": [], "cursor": "c0", "done": False, "poll_after_s": 3600},
        {"lines": [{"seq": 0, "stream": "stdout", "text": "a"}], "cursor": "c1", "done": False,
         "poll_after_s": 0},
        {"lines": [], "cursor": "c1", "done": True, "poll_after_s": 0},
    ]  # fmt: skip
    fake_api.route("GET /api/v1/jobs/7/logs", lambda r: (200, pages.pop(0)))
    pauses: list[float] = []
    monkeypatch.setattr(logs, "time", SimpleNamespace(sleep=pauses.append))
    assert run_cli(["job", "logs", "7"]) == 0
    assert capsys.readouterr().out == "a\n"
    assert pauses == [1.0, logs.LOG_POLL_MAX_S]


def test_logs_n_zero_replays_from_first_line(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    page = {"lines": [{"seq": 0, "stream": "stdout", "text": "x"}], "cursor": "c", "done": True}
    fake_api.route("GET /api/v1/jobs/7/logs", lambda r: (200, page))
    assert run_cli(["job", "logs", "7", "-n", "0", "--json"]) == 0
    assert "tail" not in fake_api.requests[0].query  # no tail: history from the first line
    assert json.loads(capsys.readouterr().out) == page["lines"][0]


def test_why_prints_the_jobs_diagnostics(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    answer = {"status": "PENDING", "sentences": ["On cluster gpu as 812.", "Waits: Resources."]}
    fake_api.route("GET /api/v1/jobs/7/diagnostics", lambda r: (200, answer))
    assert run_cli(["job", "why", "7"]) == 0
    assert capsys.readouterr().out == "PENDING\n- On cluster gpu as 812.\n- Waits: Resources.\n"


MULTI = {
    **JOB,
    "total_gpus": 8,
    "gpus": 8,
    "nodes": 2,
    "gpus_per_node": 4,
    "gpu_type": "a100",
    "virtual_gpus": False,
    "cpus": 16,
    "memory_mb": 65536,
    "image": "ghcr.io/acme/train:1",
    "ranks": [
        {"rank": 0, "node": "gpu-a1", "state": "killed", "exit_code": -15},
        {"rank": 1, "node": "gpu-b12", "state": "failed", "exit_code": 7},
    ],
}


def test_status_of_a_multi_node_job_shows_nodes_resources_and_each_rank(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/jobs/7", lambda r: (200, MULTI))
    assert run_cli(["job", "status", "7"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "gpus:           8 (2 nodes × 4 a100)" in out
    assert "cpus:           16 per node" in out and "memory:         64 GiB per node" in out
    assert "image:          ghcr.io/acme/train:1" in out
    assert out[-3:] == [
        "  RANK  NODE     STATE   EXIT",
        "  0     gpu-a1   killed  -15",
        "  1     gpu-b12  failed  7",
    ]
    assert out[-4] == "ranks:"


def test_status_of_a_single_node_job_leaves_out_what_it_did_not_ask_for(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    single = {**JOB, "nodes": 1, "gpus_per_node": 2, "gpu_type": "", "cpus": None, "image": ""}
    fake_api.route("GET /api/v1/jobs/7", lambda r: (200, {**single, "memory_mb": None}))
    assert run_cli(["job", "status", "7"]) == 0
    out = capsys.readouterr().out
    assert "gpus:           2 (virtual slots)\n" in out
    assert "cpus:" not in out and "memory:" not in out and "image:" not in out
    assert "ranks:" not in out
    assert "time limit:     none\n" in out


def test_status_of_a_queued_job_shows_its_place_and_estimated_start(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    queued = {
        **JOB,
        "status": "QUEUED",
        "queue_position": 3,
        "team_queue_position": 1,
        "ahead_jobs": 2,
        "ahead_gpus": 6,
        "estimated_start": "2026-12-02T15:04:05.123456Z",
        "estimate_reason": "",
    }
    fake_api.route("GET /api/v1/jobs/7", lambda r: (200, queued))
    assert run_cli(["job", "status", "7"]) == 0
    out = capsys.readouterr().out
    assert (
        "position:       3 on its cluster, 1 in its team; 2 job(s) asking for 6 GPU(s) ahead\n"
        in out
    )
    assert (
        "est. start:     by 2026-12-02 15:04:05 UTC (if running jobs run to their time limits)\n"
        in out
    )
    unknown = {**queued, "estimated_start": None, "estimate_reason": "waiting for window nights"}
    fake_api.route("GET /api/v1/jobs/7", lambda r: (200, unknown))
    assert run_cli(["job", "status", "7"]) == 0
    assert "est. start:     none: waiting for window nights\n" in capsys.readouterr().out


def test_list_shows_queued_jobs_positions(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    items = [
        {**JOB, "status": "QUEUED", "queue_position": 4},
        {**JOB, "id": 8, "status": "RUNNING"},
    ]
    fake_api.route("GET /api/v1/jobs", lambda r: (200, {"items": items, "next_before": None}))
    fake_api.route("GET /api/v1/arrays", lambda r: (200, []))
    assert run_cli(["job", "list"]) == 0
    header, first, second = capsys.readouterr().out.splitlines()[:3]
    assert header.split()[:4] == ["ID", "NAME", "STATUS", "POS"]
    assert first.split()[:4] == ["7", "demo", "QUEUED", "4"]
    assert second.split()[:4] == ["8", "demo", "RUNNING", "-"]


def test_status_shows_the_time_limit_as_it_is_written(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/jobs/7", lambda r: (200, {**JOB, "time_limit_s": 5400}))
    assert run_cli(["job", "status", "7"]) == 0
    assert "time limit:     1h30m\n" in capsys.readouterr().out


RANKED = [
    {"seq": 0, "rank": 0, "stream": "stdout", "text": "zero"},
    {"seq": 1, "rank": 1, "stream": "stderr", "text": "one failed"},
    {"seq": 2, "stream": "stdout", "text": "a note of no rank"},
]


def test_logs_of_a_multi_node_job_mark_each_line_with_its_rank(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    page = {"lines": RANKED, "cursor": "1:300", "done": True}
    fake_api.route("GET /api/v1/jobs/7/logs", lambda r: (200, page))
    assert run_cli(["job", "logs", "7"]) == 0
    assert capsys.readouterr() == ("[rank 0] zero\na note of no rank\n", "[rank 1] one failed\n")
    assert "rank" not in fake_api.requests[0].query
    assert run_cli(["job", "logs", "7", "--json"]) == 0  # raw objects, rank and all
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == RANKED


def test_logs_rank_asks_the_server_for_that_rank_on_every_page(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    pages = [
        {"lines": [RANKED[1]], "cursor": "1:120", "done": False},
        {"lines": [{**RANKED[1], "seq": 5, "text": "exit"}], "cursor": "1:400", "done": True},
    ]
    fake_api.route("GET /api/v1/jobs/7/logs", lambda r: (200, pages.pop(0)))
    assert run_cli(["job", "logs", "7", "--rank", "1"]) == 0
    assert capsys.readouterr() == ("", "one failed\nexit\n")  # one rank: no marks
    queries = [r.query for r in fake_api.requests]
    assert [q["rank"] for q in queries] == ["1", "1"]
    assert (queries[0]["tail"], queries[1]["cursor"]) == ("50", "1:120")


def test_logs_rank_refusals(fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture) -> None:
    sf_env(fake_api.url)
    assert run_cli(["job", "logs", "7", "--rank", "-1"]) == 2
    assert "--rank must be >= 0" in capsys.readouterr().err
    detail = "job 7 has no rank 5: its ranks are 0 to 1"
    fake_api.route("GET /api/v1/jobs/7/logs", lambda r: (400, {"detail": detail}))
    assert run_cli(["job", "logs", "7", "--rank", "5"]) == 1
    assert capsys.readouterr().err == f"error: {detail}\n"


def test_status_says_a_job_borrowed_without_naming_the_lender(
    fake_api: Any, sf_env: Any, capsys: pytest.CaptureFixture
) -> None:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/jobs/7", lambda r: (200, {**JOB, "borrowed": True}))
    assert run_cli(["job", "status", "7"]) == 0
    out = capsys.readouterr().out
    assert "borrowed:       another team's idle GPUs (preemptible)" in out
    assert "borrowed from" not in out
