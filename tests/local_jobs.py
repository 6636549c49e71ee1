"""Local jobs for real, for the tests that run them (the local executor's, the sandbox's and the
run-as proofs of tests/hostile): the runner as a process group under its team's uid, talking to
a live API server, and the steps that drive it (admit and launch, reconcile until).

A pytest plugin (`pytest_plugins` in tests/conftest.py) whose fixtures are opt-in: a module
whose tests run local jobs says `pytest.mark.usefixtures("local_jobs")`; the live server and
the runners' cleanup cost every other test nothing.
"""

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from django.core.signals import request_finished, request_started
from sf.contract import read_json

from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job
from jobs.states import JobStatus
from jobs.stores import logstore
from tests.access import let_jobs_reach_the_interpreter
from tests.factories import queued_job


class InFlight:
    """Counts the live server's requests in progress (Django's request signals)."""

    def __init__(self) -> None:
        self.count, self.lock = 0, threading.Lock()
        self.last_seen = time.monotonic()

    def started(self, **_kwargs) -> None:
        with self.lock:
            self.count += 1
            self.last_seen = time.monotonic()

    def finished(self, **_kwargs) -> None:
        with self.lock:
            self.count -= 1
            self.last_seen = time.monotonic()

    def wait_idle(self, timeout: float, quiet_s: float = 0.5) -> None:
        """Until no request is in progress and none began or ended for `quiet_s`: a request a
        runner sent just before it died is read off the socket a moment later, and only then
        counts as started."""
        deadline = time.monotonic() + timeout
        with self.lock:
            self.last_seen = time.monotonic()
        while time.monotonic() < deadline:
            with self.lock:
                if self.count <= 0 and time.monotonic() - self.last_seen >= quiet_s:
                    return
            time.sleep(0.05)


@pytest.fixture
def job_dirs(settings):
    """Executor state and run outputs outside pytest's tmp root, which every pytest session
    resets to 0700: a job under its team's uid must pass through to its own directories."""
    root = Path(tempfile.mkdtemp(prefix="sf-local-"))
    root.chmod(0o711)
    settings.SF_LOCAL_STATE_DIR = root / "local-executor"
    settings.SF_OUTPUT_ROOT = root / "runs"
    let_jobs_reach_the_interpreter()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def local_jobs(live_server, settings, job_dirs):
    """Runners of this test's local jobs reach the live server, and are ended with the test."""
    # After job_dirs, so torn down before it: the runners are found by their proc.json files,
    # which job_dirs' teardown removes.
    settings.SF_API_URL = live_server.url
    settings.SF_RUNNER_PYTHON = sys.executable
    in_flight = InFlight()
    request_started.connect(in_flight.started)
    request_finished.connect(in_flight.finished)
    yield
    # Runners live in their own sessions: end this test's before its database is flushed, so
    # none posts to the live server between tests.
    for proc_file in Path(settings.SF_LOCAL_STATE_DIR).glob("*/*/proc.json"):
        pids = [
            read_json(proc_file).get("pid"),
            read_json(proc_file.with_name("started.json")).get("pid"),
        ]
        for pid in filter(None, pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(process_alive(p) for p in filter(None, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
    # A request a runner sent before it died may still hold row locks: the database flush
    # after the test would deadlock with it.
    in_flight.wait_idle(timeout=10)
    request_started.disconnect(in_flight.started)
    request_finished.disconnect(in_flight.finished)


def python_job(team, user, code: str, total_gpus: int = 1) -> Job:
    return queued_job(team, user, total_gpus=total_gpus, entrypoint=[sys.executable, "-c", code])


def start(*jobs: Job) -> list[Attempt]:
    ids = admit_queued_jobs().admitted
    launch_attempts(ids)
    return [Job.objects.get(pk=j.pk).current_attempt for j in jobs]


def run_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reconcile_all()
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def finished(job: Job) -> bool:
    return Job.objects.get(pk=job.pk).status in JobStatus.terminal()


def texts(job: Job) -> list[str]:
    return [json.loads(line)["text"] for line in logstore.read(job.pk, None, 10_000).raw_lines]
