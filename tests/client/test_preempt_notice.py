"""The runner's side of a preemption: SIGUSR1 (the local executor's notice) writes the job's
notice file, sends the job SIGTERM and kills it SF_PREEMPT_GRACE_S later; a SIGTERM waits
SF_STOP_GRACE_S; the SDK's sf.should_checkpoint() turns true and keeps the SIGTERM from ending
the job; the checkpoint scan follows no link and stops at its bounds."""

import ctypes
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sf import checkpoints
from sf.contract import NOTICE_FILE_VAR

from tests.client.helpers import exit_record, runner_env

CHECKPOINTING = """\
import sys, time
import sf
sf.should_checkpoint()
print("ready", flush=True)
for step in range(600):
    time.sleep(0.05)
    if sf.should_checkpoint():
        print("notice", sf.stop_notice()["kind"], flush=True)
        sys.exit(3)
"""
STUBBORN = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def start(env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sf.runner"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_a_preemption_notice_reaches_a_checkpointing_job_which_exits_in_its_grace(tmp_path):
    env = runner_env(tmp_path, "", "", [sys.executable, "-c", CHECKPOINTING])
    env["SF_PREEMPT_GRACE_S"] = "30"
    proc = start(env)
    sent = time.time()
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=20) == 3
    assert proc.stdout is not None and b"notice preempted" in proc.stdout.read()
    notice = json.loads((Path(env["SF_EXIT_FILE"]).parent / "notice.json").read_text())
    assert notice["kind"] == "preempted"
    assert sent - 1 < notice["at"] < sent + 5
    assert notice["kill_at"] == pytest.approx(notice["at"] + 30, abs=0.5)
    assert exit_record(env)["exit_code"] == 3


@pytest.mark.parametrize(
    ("signum", "grace_var"),
    [(signal.SIGUSR1, "SF_PREEMPT_GRACE_S"), (signal.SIGTERM, "SF_STOP_GRACE_S")],
)
def test_a_job_that_ignores_its_notice_is_killed_after_that_signals_grace(
    tmp_path, signum, grace_var
):
    env = runner_env(tmp_path, "", "", [sys.executable, "-c", STUBBORN])
    env[grace_var] = "3"
    proc = start(env)
    sent = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=30)
    took = time.monotonic() - sent
    assert 2.5 < took < 8, took  # not the other grace (10 s for a stop, 120 s for a preemption)
    assert exit_record(env)["reason"] == "killed by signal 9"


TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or TGKILL is None, reason="tgkill: Linux x86_64/arm64"
)
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_a_notice_the_kernel_hands_to_another_thread_of_the_runner_is_acted_on(tmp_path, signum):
    """A signal sent to the runner's process may be delivered to any of its threads; Python
    runs the handler in the main thread, which must not sit in a wait the signal cannot
    interrupt. tgkill aims it at a reader or sampler thread: the case CI met by chance."""
    env = runner_env(tmp_path, "", "", [sys.executable, "-c", STUBBORN])
    env["SF_PREEMPT_GRACE_S" if signum == signal.SIGUSR1 else "SF_STOP_GRACE_S"] = "2"
    proc = start(env)
    others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
    assert others, "the runner has threads of its own by the time the job prints"
    sent = time.monotonic()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(TGKILL, proc.pid, others[0], signum) == 0
    try:
        proc.wait(timeout=20)  # the job sleeps 60 s: only the runner's SIGKILL ends it sooner
    finally:
        proc.kill()
    assert time.monotonic() - sent < 8
    assert exit_record(env)["reason"] == "killed by signal 9"


def test_without_starforge_should_checkpoint_is_false_and_sigterm_still_ends_the_process():
    code = (
        "import signal, sf; print(sf.should_checkpoint(), "
        "signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)"
    )
    env = {k: v for k, v in os.environ.items() if k != NOTICE_FILE_VAR}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True"]


def test_a_handler_of_the_jobs_own_is_left_in_place(tmp_path):
    code = (
        "import signal, sf\n"
        "def mine(*a): pass\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        "sf.should_checkpoint()\n"
        "print(signal.getsignal(signal.SIGTERM) is mine)\n"
    )
    env = {**os.environ, NOTICE_FILE_VAR: str(tmp_path / "notice.json")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True"


def test_the_checkpoint_scan_follows_no_link_and_stops_at_its_bounds(tmp_path):
    root = tmp_path / "ckpt"
    (root / "a" / "b" / "c").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_text("x")
    os.utime(outside, (4e9, 4e9))
    (root / "link").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    (root / "ckpt-1.json").write_text("{}")
    os.utime(root / "ckpt-1.json", (1000, 1000))
    (root / "a" / "b" / "c" / "deep").write_text("{}")
    os.utime(root / "a" / "b" / "c" / "deep", (3000, 3000))
    (root / "a" / "ckpt-2.json").write_text("{}")
    os.utime(root / "a" / "ckpt-2.json", (2000, 2000))
    assert checkpoints.newest_mtime(str(root)) == 2000  # the link's target and the 4th level: no
    assert checkpoints.newest_mtime(str(root), max_depth=4) == 3000
    assert checkpoints.newest_mtime(str(tmp_path / "missing")) == 0.0
    many = tmp_path / "many"
    many.mkdir()
    for i in range(50):
        (many / f"f{i}").write_text("")
    assert checkpoints.newest_mtime(str(many), max_entries=10) > 0  # stops, does not fail


def test_the_notice_is_written_beside_not_through_a_link_the_job_left(tmp_path):
    target = tmp_path / "target"
    target.write_text("mine")
    (tmp_path / "notice.json").symlink_to(target)
    checkpoints.write_notice(str(tmp_path / "notice.json"), "preempted", 123.0)
    assert target.read_text() == "mine"
    assert json.loads((tmp_path / "notice.json").read_text())["kill_at"] == 123.0
    assert not (tmp_path / "notice.json").is_symlink()
