"""Job lifecycle on the real stack: pause/resume, stop, a worker crash mid-resume and mid-retry,
and automatic retries with cooldown.

The ASGI server, Celery worker and Celery beat run as separate process groups (so a test can
SIGKILL the worker alone) on the embedded SQLite ledger; jobs are driven through the `sf` CLI,
and backend processes are checked with psutil. SF_LAUNCH_STUCK_S=5 and SF_LAUNCH_CLAIM_S=20
let the reconciler and the next launcher repair a launch a crashed worker left half done within
seconds instead of minutes.
"""

import datetime as dt
import json
import shutil
import time
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.stack import (
    ROOT,
    Stack,
    live_runners,
    running,
    sf_command,
    steps_printed,
    wait_until,
)

pytestmark = pytest.mark.e2e
FLAKY = """\
import os
import sys

attempt = int(os.environ["SF_ATTEMPT"])
if attempt < 3:
    print(f"attempt {attempt}")
    sys.exit(1)
print("ok")
"""
NOT_SETTLED = {"QUEUED", "SUBMITTED", "PENDING", "RUNNING", "PAUSED"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    # A worker SIGKILLed between claiming a launch and recording it holds the claim until it
    # expires (SF_LAUNCH_CLAIM_S, 120 s by default): 20 s lets the next launcher take it over
    # (adopting by name, so still once) within the tests' waits.
    running_stack = Stack(
        tmp_path_factory.mktemp("var"), SF_LAUNCH_STUCK_S="5", SF_LAUNCH_CLAIM_S="20"
    )
    try:
        yield running_stack.start()
    finally:
        running_stack.close()


@pytest.fixture(autouse=True)
def _stack_logs_on_failure(request, stack) -> Iterator[None]:
    """A failed test prints the tail of every stack log, so a CI failure can be diagnosed."""
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line(f"\nstack logs after {request.node.name}:\n{stack.diagnostics()}")


@pytest.fixture(scope="module")
def sf(stack, tmp_path_factory) -> Callable:
    home = tmp_path_factory.mktemp("client")
    workdir = home / "project"
    shutil.copytree(ROOT / "examples", workdir)
    (workdir / "flaky.py").write_text(FLAKY)
    (workdir / ".sfignore").write_text("checkpoints/\n")
    run = sf_command(workdir, home / "sf.json")
    run("login", "--url", stack.url, "--token", stack.token)
    return run


@pytest.fixture
def submit(sf, stack) -> Iterator[Callable[..., dict]]:
    """`sf submit --json ARGS`; every job still holding or awaiting GPUs is stopped afterwards."""
    ids: list[int] = []

    def run(*args: str) -> dict:
        job = json.loads(sf("submit", "--json", *args).stdout)
        ids.append(job["id"])
        return job

    yield run
    for job_id in ids:
        job = stack.job(job_id)
        if job["status"] in NOT_SETTLED or job.get("next_attempt_at"):
            sf("job", "stop", str(job_id), check=False)


def status(sf, job_id: int) -> dict:
    return json.loads(sf("job", "status", str(job_id), "--json").stdout)


def logs(sf, job_id: int) -> list[str]:
    return sf("job", "logs", str(job_id), "-n", "0", "--no-follow").stdout.splitlines()


def backend_pids(stack: Stack, job_ref: str) -> dict[str, int]:
    """The runner's pid (proc.json) and the entrypoint's pid (started.json) of an attempt."""
    attempt_dir = stack.attempt_dir(job_ref)
    runner = json.loads((attempt_dir / "proc.json").read_text())["pid"]
    entrypoint = json.loads((attempt_dir / "started.json").read_text())["pid"]
    return {"runner": runner, "entrypoint": entrypoint}


def wait_gone(stack: Stack, pids: dict[str, int], timeout: float) -> None:
    wait_until(
        lambda: not any(running(pid) for pid in pids.values()),
        timeout,
        f"the backend processes {pids} to end",
        stack.diagnostics,
    )


def ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


def test_pause_then_resume_continues_from_the_latest_checkpoint(sf, stack, submit):
    job = submit("--gpus", "1", "--", "python", "train.py", "--steps", "30", "--sleep", "0.2")
    job_id = job["id"]
    stack.wait_job(job_id, lambda j: j["status"] == "RUNNING", 60, "RUNNING")
    wait_until(
        lambda: max(steps_printed(logs(sf, job_id)), default=0) >= 7,
        30,
        "step 7 in the logs",
        stack.diagnostics,
    )

    paused = json.loads(sf("job", "pause", str(job_id), "--json").stdout)
    assert paused["status"] == "PAUSED"
    pids = backend_pids(stack, paused["job_ref"])
    wait_gone(stack, pids, 15)
    # The runner ships every line before it exits, so this is all attempt 1 printed.
    printed = logs(sf, job_id)
    before = steps_printed(printed)
    # The pause's SIGTERM is a notice (sf.should_checkpoint()): the job saved the step it was
    # at and exited, so the resumed attempt goes on from the next step.
    checkpoint = max(before)
    assert f"notice received: checkpointed step {checkpoint}, exiting" in printed
    assert before == list(range(1, max(before) + 1)) and 7 <= checkpoint < 30
    assert status(sf, job_id)["status"] == "PAUSED"

    sf("job", "resume", str(job_id))
    stack.wait_job(
        job_id, lambda j: j["attempt"] == 2 and j["status"] == "RUNNING", 60, "RUNNING again"
    )
    stack.wait_job(job_id, lambda j: j["status"] == "SUCCEEDED", 60, "SUCCEEDED")

    lines = sf("job", "logs", str(job_id), "-n", "0", timeout=60).stdout.splitlines()
    assert f"resuming from step {checkpoint}" in lines and lines[-1] == "done"
    resumed = lines[lines.index(f"resuming from step {checkpoint}") + 1 :]
    assert steps_printed(resumed) == list(range(checkpoint + 1, 31))
    final = status(sf, job_id)
    assert (final["id"], final["attempt"], final["retry_count"]) == (job_id, 2, 0)
    assert (final["run_id"], final["output_dir"]) == (job["run_id"], job["output_dir"])
    attempts = stack.attempts(job_id)
    assert [a["number"] for a in attempts] == [1, 2]
    assert attempts[0]["end_reason"].startswith("paused by")
    assert attempts[1]["exit_code"] == 0


def test_stop_ends_the_runner_and_the_training_process(sf, stack, submit):
    job = submit("--gpus", "1", "--", "python", "train.py", "--steps", "1000", "--sleep", "0.2")
    running_job = stack.wait_job(job["id"], lambda j: j["status"] == "RUNNING", 60, "RUNNING")
    pids = backend_pids(stack, running_job["job_ref"])
    assert all(running(pid) for pid in pids.values())

    stopped = json.loads(sf("job", "stop", str(job["id"]), "--json").stdout)
    assert stopped["status"] == "STOPPED"
    wait_gone(stack, pids, 15)
    assert status(sf, job["id"])["status"] == "STOPPED"
    assert stack.attempts(job["id"])[0]["end_reason"].startswith("stopped by")


def test_a_time_limit_stops_the_job_and_its_processes_and_is_not_retried(sf, stack, submit):
    argv = ["--gpus", "1", "--time-limit", "4s", "--max-retries", "2"]
    job = submit(*argv, "--", "python", "train.py", "--steps", "1000", "--sleep", "0.2")
    assert job["time_limit_s"] == 4
    running_job = stack.wait_job(job["id"], lambda j: j["status"] == "RUNNING", 60, "RUNNING")
    pids = backend_pids(stack, running_job["job_ref"])
    # The reconciler's next tick (beat: every 2 s) after the 4 s are up.
    stopped = stack.wait_job(job["id"], lambda j: j["status"] == "STOPPED", 30, "STOPPED")
    assert stopped["status_reason"].startswith("time limit reached: ran ")
    assert stopped["status_reason"].endswith(", its limit is 4 s")
    wait_gone(stack, pids, 15)
    (attempt,) = stack.attempts(job["id"])
    ran = (ts(attempt["end_time"]) - ts(attempt["start_time"])).total_seconds()
    assert 4 < ran < 4 + 10  # billed as run: to the tick that stopped it
    time.sleep(3)  # no automatic retry comes
    final = status(sf, job["id"])
    assert (final["status"], final["attempt"], final["next_attempt_at"]) == ("STOPPED", 1, None)


def test_a_worker_crash_right_after_resume_or_retry_launches_the_attempt_exactly_once(
    sf, stack, submit
):
    job = submit("--gpus", "1", "--", "python", "train.py", "--steps", "200", "--sleep", "0.2")
    job_id, run_id = job["id"], job["run_id"]
    stack.wait_job(job_id, lambda j: j["status"] == "RUNNING", 60, "RUNNING")
    sf("job", "pause", str(job_id))
    wait_until(lambda: not live_runners(run_id), 15, "attempt 1's runner to end", stack.diagnostics)

    sf("job", "resume", str(job_id))
    crash_worker_and_restart(stack)
    expect_one_runner(stack, job_id, run_id, attempt=2)

    stopped = json.loads(sf("job", "stop", str(job_id), "--json").stdout)
    assert stopped["status"] == "STOPPED"
    sf("job", "retry", str(job_id))
    crash_worker_and_restart(stack)
    expect_one_runner(stack, job_id, run_id, attempt=3)

    assert [a["number"] for a in stack.attempts(job_id)] == [1, 2, 3]
    assert status(sf, job_id)["retry_count"] == 1
    assert json.loads(sf("job", "stop", str(job_id), "--json").stdout)["status"] == "STOPPED"
    wait_until(lambda: not live_runners(run_id), 15, "attempt 3's runner to end", stack.diagnostics)


def crash_worker_and_restart(stack: Stack) -> None:
    stack.kill_worker()
    time.sleep(3)
    stack.start_worker()


def expect_one_runner(stack: Stack, job_id: int, run_id: str, attempt: int) -> None:
    job = stack.wait_job(
        job_id,
        lambda j: j["attempt"] == attempt and j["status"] not in {"QUEUED", "SUBMITTED", "PENDING"},
        60,
        f"attempt {attempt} to run",
    )
    assert job["status"] == "RUNNING", (
        f"attempt {attempt} did not run: {json.dumps(job, indent=1)}\n"
        f"live runners: {live_runners(run_id)}\n{stack.diagnostics()}"
    )

    def one_runner() -> dict | None:
        runners = live_runners(run_id)
        return runners if list(runners) == [attempt] else None

    wait_until(
        one_runner,
        15,
        f"only attempt {attempt}'s runner to be alive",
        lambda: f"live runners: {live_runners(run_id)}\n{stack.diagnostics()}",
    )
    time.sleep(4.5)  # two more reconcile ticks: a second launch would show up by now
    runners = live_runners(run_id)
    assert list(runners) == [attempt] and len(runners[attempt]) == 1, runners


def test_auto_retry_waits_a_doubling_cooldown_and_bills_only_running_time(sf, stack, submit):
    job = submit(
        *("--gpus", "1", "--max-retries", "2", "--retry-cooldown", "1"),
        *("--", "python", "flaky.py"),
    )
    job_id = job["id"]

    def settled(j: dict) -> bool:  # FAILED with a next attempt scheduled is still retrying
        return j["status"] not in NOT_SETTLED and not j.get("next_attempt_at")

    stack.wait_job(job_id, settled, 90, "the retries to settle")

    final = status(sf, job_id)
    assert (final["status"], final["retry_count"], final["attempt"]) == ("SUCCEEDED", 2, 3), final
    attempts = stack.attempts(job_id)
    assert [(a["number"], a["exit_code"]) for a in attempts] == [(1, 1), (2, 1), (3, 0)]
    for i, (failed, retried) in enumerate(zip(attempts, attempts[1:], strict=False)):
        waited = (ts(retried["submitted_at"]) - ts(failed["end_time"])).total_seconds()
        assert waited >= 1 * 2**i, (i + 1, waited, attempts)
    # Only running time is billed: each attempt's GPU-seconds are (end - start_time) x GPUs
    # (the API gives times to the millisecond, hence the tolerance), and the job's are their sum.
    for a in attempts:
        running_s = (ts(a["end_time"]) - ts(a["start_time"])).total_seconds()
        assert abs(a["gpu_seconds"] - running_s * a["gpus"]) <= 2e-3 * a["gpus"], a
    billed = sum(a["gpu_seconds"] for a in attempts)
    assert abs(final["gpu_seconds"] - billed) <= 1e-3, (final["gpu_seconds"], attempts)
    text = logs(sf, job_id)
    assert {"attempt 1", "attempt 2", "ok"} <= set(text), text
