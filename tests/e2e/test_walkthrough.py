"""The README walkthrough, for real: `manage.py runstack` (ASGI server, Celery worker and beat,
Redis) on the embedded SQLite default, driven only through the `sf` CLI as a user would."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.stack import ROOT, free_port, kill_group, sf_command, stack_env

pytestmark = pytest.mark.e2e


def loss_at(step: int) -> float:
    spec = importlib.util.spec_from_file_location("train", ROOT / "examples" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    return train.loss_at(step)


def start_stack(var: Path, **extra: str) -> tuple[subprocess.Popen, str, str]:
    """`manage.py runstack` on the embedded default (and `extra` variables); returns the
    process, URL and demo token."""
    port = free_port()
    env = stack_env(var, port, **extra)  # the embedded SQLite ledger, as `make run` uses
    with open(var / "stack.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runstack"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        token = _wait_for_banner(var / "stack.log", proc)
    except BaseException:
        stop_stack(proc)  # a stack that did not come up is not left running
        raise
    return proc, f"http://127.0.0.1:{port}", token


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    var = tmp_path_factory.mktemp("var")
    proc, url, token = start_stack(var)
    try:
        yield {"url": url, "token": token, "var": var, "pid": proc.pid}
    finally:
        stop_stack(proc)


def stop_stack(proc: subprocess.Popen) -> None:
    """SIGTERM to the stack's process group, SIGKILL to whatever outlives it."""
    kill_group(proc, signal.SIGTERM, wait=20)


def _wait_for_banner(log: Path, proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if "sf login --url" in line:
                time.sleep(2)  # let the worker and beat finish connecting
                return line.split("--token")[1].strip()
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    raise AssertionError("the stack did not come up:\n" + log.read_text()[-3000:])


@pytest.fixture
def sf(stack, tmp_path):
    workdir = tmp_path / "project"
    shutil.copytree(ROOT / "examples", workdir)
    (workdir / "big.bin").write_bytes(b"x" * 1024)
    (workdir / ".sfignore").write_text("checkpoints/\nbig.bin\n")
    run = sf_command(workdir, tmp_path / "sf.json")
    run("login", "--url", stack["url"], "--token", stack["token"])
    return run


def test_submit_follow_logs_and_succeed(sf):
    submitted = sf(
        "submit", "--gpus", "1", "--", "python", "train.py", "--steps", "12", "--sleep", "0.05"
    )
    assert "run_id" in submitted.stdout
    logs = sf("job", "logs").stdout.splitlines()  # follows the latest job until it ends
    assert logs == [f"step {n} loss {loss_at(n):.4f}" for n in range(1, 13)] + ["done"]
    status = json.loads(sf("job", "status", "--json").stdout)
    assert status["status"] == "SUCCEEDED" and status["exit_code"] == 0
    assert status["ended_at"] and status["attempt"] == 1 and status["virtual_gpus"]
    assert status["gpu_seconds"] > 0
    replay = sf("job", "logs", str(status["id"]), "-n", "0").stdout.splitlines()
    assert replay == logs


def test_failure_is_reported_then_retry_resumes_from_checkpoint(sf):
    sf(
        "submit",
        "--gpus",
        "0",
        "--",
        "python",
        "train.py",
        "--steps",
        "8",
        "--sleep",
        "0.02",
        "--fail-at",
        "7",
    )
    sf("job", "logs", check=False)
    failed = json.loads(sf("job", "status", "--json").stdout)
    assert failed["status"] == "FAILED" and failed["exit_code"] == 3
    assert failed["status_reason"].startswith("exited with code 3; last lines:")
    sf("job", "retry")
    tail = sf("job", "logs", "-n", "0").stdout.splitlines()
    assert "resuming from step 5" in tail and tail[-1] == "done"
    again = json.loads(sf("job", "status", "--json").stdout)
    assert (again["status"], again["attempt"], again["retry_count"]) == ("SUCCEEDED", 2, 1)
    assert again["run_id"] == failed["run_id"]


def test_follow_on_jobs_run_after_success_and_read_the_parent_outputs(sf):
    sf(
        "submit",
        "--gpus",
        "1",
        "--then",
        "eval",
        "--then",
        "export",
        "--",
        "python",
        "train.py",
        "--steps",
        "6",
        "--sleep",
        "0.02",
    )
    parent = json.loads(sf("job", "status", "--json").stdout)
    sf("job", "logs", str(parent["id"]), check=False)  # follows the parent until it ends
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        jobs = json.loads(sf("job", "list", "--json").stdout)
        children = {j["follow_on_name"]: j for j in jobs if j["parent"] == parent["id"]}
        if len(children) == 2 and all(j["terminal"] for j in children.values()):
            break
        time.sleep(0.5)
    assert {name: j["status"] for name, j in children.items()} == {
        "eval": "SUCCEEDED",
        "export": "SUCCEEDED",
    }
    eval_log = sf("job", "logs", str(children["eval"]["id"]), "-n", "0").stdout
    assert eval_log.startswith("eval step 5 accuracy")
    export_log = sf("job", "logs", str(children["export"]["id"]), "-n", "0").stdout
    assert export_log.startswith("exported step 5 to ")


def _celery_and_web_niceness(stack_pid: int) -> tuple[set[int], set[int]]:
    import psutil

    stacked = psutil.Process(stack_pid).children(recursive=True)
    celery = {p.nice() for p in stacked if "celery" in p.cmdline()}
    web = {p.nice() for p in stacked if "granian" in " ".join(p.cmdline())}
    assert celery and web
    return celery, web


def test_on_the_embedded_ledger_the_worker_keeps_its_priority(stack):
    ours = os.getpriority(os.PRIO_PROCESS, 0)  # runstack's, and so every process's it starts
    assert _celery_and_web_niceness(stack["pid"]) == ({ours}, {ours})


def test_a_niced_worker_yields_the_cpu_to_the_web_but_its_jobs_do_not(tmp_path):
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    proc, url, token = start_stack(tmp_path, SF_WORKER_NICE="7")
    try:
        assert _celery_and_web_niceness(proc.pid) == ({min(19, ours + 7)}, {ours})
        workdir = tmp_path / "project"
        workdir.mkdir()
        sf = sf_command(workdir, tmp_path / "sf.json")
        sf("login", "--url", url, "--token", token)
        probe = "import os; print('niceness', os.getpriority(os.PRIO_PROCESS, 0))"
        sf("submit", "--gpus", "0", "--", "python", "-c", probe)
        assert sf("job", "logs").stdout.splitlines() == [f"niceness {ours}"]
    finally:
        stop_stack(proc)


def test_list_shows_jobs_and_bad_input_is_refused(sf):
    assert "SUCCEEDED" in sf("job", "list").stdout
    refused = sf("job", "status", "999999", check=False)
    assert refused.returncode != 0 and "does not exist" in refused.stderr
    negative = sf("submit", "--gpus", "-1", "--", "python", "train.py", check=False)
    assert negative.returncode != 0


def test_ctrl_c_stops_every_process_make_run_started(tmp_path):
    import psutil

    proc, _, _ = start_stack(tmp_path)
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 3  # uvicorn, celery worker (+ pool), celery beat
        proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the foreground process
        assert proc.wait(timeout=30) == 0
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert alive == []
    finally:
        stop_stack(proc)  # a failed check leaves nothing running
