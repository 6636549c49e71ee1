"""`sf job list --watch` (a fresh table each interval until Ctrl-C, which exits 0) and
`sf completion bash|zsh` (scripts made from the parser, run here by a real bash)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sf import cli
from sf.commands import listing

from tests.client.helpers import run_cli

JOB = {"id": 7, "name": "demo", "team": "vision", "user": "ada", "total_gpus": 1, "attempt": 1}


@pytest.fixture
def jobs_api(fake_api: Any, sf_env: Any) -> Any:
    """A server whose job 7 is QUEUED on the first list and RUNNING on every later one."""
    sf_env(fake_api.url)
    answers = iter(["QUEUED"])

    def jobs(_req: Any) -> tuple[int, Any]:
        return 200, {"items": [{**JOB, "status": next(answers, "RUNNING")}]}

    fake_api.route("GET /api/v1/jobs", jobs)
    fake_api.route("GET /api/v1/arrays", lambda _req: (200, []))
    return fake_api


@pytest.fixture
def ctrl_c_on_second_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The user presses Ctrl-C during the second pause between redraws: the pauses asked.

    `listing.time` is the `time` module itself, so every thread's sleep comes here; only the test's
    own thread (the CLI's) is counted, and any other (a runner's metrics flusher an earlier test
    left behind) sleeps as it would have: it once took the Ctrl-C, and the watch never ended."""
    asked: list[float] = []
    cli_thread, real_sleep = threading.get_ident(), time.sleep

    def sleep(seconds: float) -> None:
        if threading.get_ident() != cli_thread:
            real_sleep(seconds)
            return
        asked.append(seconds)
        if len(asked) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(listing.time, "sleep", sleep)
    return asked


# -- --watch -------------------------------------------------------------------------------------
def test_watch_on_a_pipe_prints_a_fresh_table_each_interval_until_ctrl_c_then_exits_0(
    jobs_api: Any, ctrl_c_on_second_sleep: list[float], capsys: pytest.CaptureFixture
) -> None:
    assert run_cli(["job", "list", "--watch", "--interval", "1.5"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    first, second, rest = out.split("\n\n")
    assert first.split()[:3] == second.split()[:3] == ["ID", "NAME", "STATUS"]
    assert "QUEUED" in first and "RUNNING" not in first
    assert "RUNNING" in second
    assert rest == ""
    assert ctrl_c_on_second_sleep == [1.5, 1.5]
    assert [r.query.get("mine") for r in jobs_api.requests] == ["true"] * 4  # jobs, arrays


def test_watch_waits_two_seconds_by_default(
    jobs_api: Any, ctrl_c_on_second_sleep: list[float]
) -> None:
    assert run_cli(["job", "list", "--watch"]) == 0
    assert ctrl_c_on_second_sleep == [2.0, 2.0]


def test_watch_on_a_terminal_redraws_the_table_in_place(
    jobs_api: Any,
    ctrl_c_on_second_sleep: list[float],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich takes the captured stdout for a terminal
    assert run_cli(["job", "list", "--watch", "--interval", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "every 0.5s" in out and "Ctrl-C stops" in out
    queued, running = out.index("QUEUED"), out.index("RUNNING")
    # Between the two tables: the cursor goes back up over the first to draw the second.
    assert "\x1b[1A" in out[queued:running] and "\x1b[2K" in out[queued:running]
    assert "\n\n" not in out


def test_watch_with_json_is_a_usage_error_before_any_request(
    jobs_api: Any, capsys: pytest.CaptureFixture
) -> None:
    assert run_cli(["job", "list", "--watch", "--json"]) == 2
    assert "--watch redraws a table for people" in capsys.readouterr().err
    assert jobs_api.requests == []


@pytest.mark.parametrize("interval", ["0.1", "0", "-1", "inf", "nan"])
def test_watch_interval_under_half_a_second_is_a_usage_error(
    jobs_api: Any, interval: str, capsys: pytest.CaptureFixture
) -> None:
    assert run_cli(["job", "list", "--watch", "--interval", interval]) == 2
    assert "--interval must be a number of seconds, at least 0.5" in capsys.readouterr().err
    assert jobs_api.requests == []


def test_interval_without_watch_is_a_usage_error(
    jobs_api: Any, capsys: pytest.CaptureFixture
) -> None:
    assert run_cli(["job", "list", "--interval", "5"]) == 2
    assert "--interval goes with --watch" in capsys.readouterr().err


# -- completion ----------------------------------------------------------------------------------
def script(shell: str, capsys: pytest.CaptureFixture) -> str:
    capsys.readouterr()
    assert run_cli(["completion", shell]) == 0
    return capsys.readouterr().out


@pytest.fixture
def bash_script(tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    path = tmp_path / "sf.bash"
    path.write_text(script("bash", capsys))
    return path


def complete(bash_script: Path, *words: str) -> list[str]:
    """What the completion offers for `sf WORDS...`, the last word being the one completed."""
    quoted = " ".join(f"'{w}'" for w in ("sf", *words))
    run = (
        f"source '{bash_script}'; COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; "
        '_sf_complete; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", run], capture_output=True, text=True, check=True)
    return [w for w in out.stdout.splitlines() if w]


def test_bash_script_is_valid_bash_and_registers_its_function_for_sf(bash_script: Path) -> None:
    subprocess.run(["bash", "-n", str(bash_script)], check=True)
    run = f"source '{bash_script}'; complete -p sf"
    out = subprocess.run(["bash", "-c", run], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "complete -o default -F _sf_complete sf"


def test_bash_completes_a_command_from_its_start(bash_script: Path) -> None:
    assert complete(bash_script, "no") == ["notify"]
    assert set(complete(bash_script, "")) >= {"job", "team", "notify", "completion", "submit"}


def test_bash_completes_the_verbs_of_a_command(bash_script: Path) -> None:
    assert complete(bash_script, "team", "") == [
        "list",
        "show",
        "add-member",
        "remove-member",
        "set-role",
        "set",
    ]


def test_bash_completes_options_and_their_choices(bash_script: Path) -> None:
    assert complete(bash_script, "job", "list", "--w") == ["--watch"]
    assert complete(bash_script, "usage", "--by", "") == [
        "team",
        "user",
        "cluster",
        "gpu_type",
        "day",
    ]
    assert complete(bash_script, "team", "add-member", "v", "bob", "--role", "a") == ["admin"]
    assert complete(bash_script, "team", "set-role", "vision", "bob", "") == [
        "member",
        "viewer",
        "admin",
    ]
    assert complete(bash_script, "completion", "") == ["bash", "zsh"]


def test_bash_skips_option_values_and_leaves_the_jobs_command_alone(bash_script: Path) -> None:
    # `--url`'s value is not a command (read as one, "team" would offer only team's "list");
    # after `--` comes the job's command, not sf's words.
    assert complete(bash_script, "--url", "team", "job", "l") == ["list", "logs"]
    assert complete(bash_script, "submit", "--", "") == []


def test_a_new_command_is_completed_without_touching_the_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    built = cli.build_parser

    def with_frob() -> argparse.ArgumentParser:
        parser = built()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        frob = sub.add_parser("frob").add_subparsers().add_parser("twiddle")
        frob.add_argument("--knob", choices=["up", "down"])
        return parser

    monkeypatch.setattr(cli, "build_parser", with_frob)
    path = tmp_path / "sf.bash"
    path.write_text(script("bash", capsys))
    assert complete(path, "fr") == ["frob"]
    assert complete(path, "frob", "") == ["twiddle"]
    assert complete(path, "frob", "twiddle", "--knob", "") == ["up", "down"]


def test_zsh_script_loads_bashcompinit_then_the_bash_completion(
    capsys: pytest.CaptureFixture,
) -> None:
    zsh, bash = script("zsh", capsys), script("bash", capsys)
    prelude, _, rest = zsh.partition("# bash completion for sf")
    assert "compinit" in prelude and "bashcompinit" in prelude
    assert "# bash completion for sf" + rest == bash
    assert zsh.rstrip().endswith("complete -o default -F _sf_complete sf")


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_is_valid_zsh(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "sf.zsh"
    path.write_text(script("zsh", capsys))
    subprocess.run(["zsh", "-n", str(path)], check=True)


def test_an_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    assert run_cli(["completion", "fish"]) == 2
    assert "invalid choice: 'fish'" in capsys.readouterr().err
