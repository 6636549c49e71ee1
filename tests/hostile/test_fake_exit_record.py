"""A job that writes the runner's exit record itself decides nothing (issue 12, point 4).

Run as the server's own user (run_as none), the worst case: the job can write into its attempt
dir. Its record is not signed, so while the runner lives the attempt stays RUNNING, its end is
the real end, and stop ends every process it set up, even behind setsid and a double fork.
"""

import json
import time
import uuid
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from jobs.actions import control
from jobs.executors.local import LocalExecutor
from jobs.loops.reconciler import reconcile_all
from jobs.models import Job
from jobs.states import JobStatus
from tests.local_jobs import finished, process_alive, python_job, run_until, start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("local_jobs")]

FAKE_EXIT = """
import json, time
record = {"exit_code": 0, "reason": "", "started_at": time.time() - 1, "ended_at": time.time()}
with open("../exit.json", "w") as fh:
    json.dump(record, fh)
print("faked", flush=True)
"""

DETACHED = """
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends this one
        with open("detached.pid", "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(120)
    os._exit(0)
"""


@pytest.fixture(autouse=True)
def _as_the_servers_user(local_cluster):
    local_cluster.settings = {**local_cluster.settings, "run_as": ""}
    local_cluster.save()


def status(job: Job) -> str:
    return Job.objects.get(pk=job.pk).status


def test_a_job_that_fakes_its_exit_stays_running_and_is_billed_until_it_really_ends(team, alice):
    job = python_job(team, alice, FAKE_EXIT + "time.sleep(6)\n", total_gpus=1)
    started = time.monotonic()
    start(job)
    run_until(lambda: status(job) == JobStatus.RUNNING)
    while time.monotonic() - started < 4.5:
        reconcile_all()
        assert status(job) == JobStatus.RUNNING
        time.sleep(0.2)
    run_until(lambda: finished(job))
    job.refresh_from_db()
    attempt = job.current_attempt
    assert job.status == JobStatus.SUCCEEDED
    assert (attempt.end_time - attempt.start_time).total_seconds() >= 5.5


def test_stop_ends_a_job_that_faked_its_exit_and_hid_a_process(team, alice, local_cluster):
    marker = f"sf-hostile-{uuid.uuid4().hex}"
    code = DETACHED + FAKE_EXIT + "time.sleep(120)\n"
    job = python_job(team, alice, code, total_gpus=0)
    job.entrypoint = [*job.entrypoint, marker]
    job.save(update_fields=["entrypoint"])
    [attempt] = start(job)
    work = LocalExecutor(local_cluster).root / attempt.job_ref / "work"
    run_until(lambda: status(job) == JobStatus.RUNNING and (work / "detached.pid").exists())
    detached = int((work / "detached.pid").read_text())
    record = json.loads((work.parent / "exit.json").read_text())
    assert record["exit_code"] == 0 and "mac" not in record  # the job's own, unsigned
    control.stop_job(User.objects.get(username="alice"), job.pk)
    executor = LocalExecutor(local_cluster)
    deadline = time.monotonic() + 40
    # The runner ends every process of the job before it writes its signed exit record: the
    # attempt has no outcome until then, and none of its processes lives on after it.
    while executor.poll([attempt.job_ref])[attempt.job_ref].native_state == "RUNNING":
        assert time.monotonic() < deadline, "the stopped job's runner did not end"
        reconcile_all()
        time.sleep(0.2)
    assert not process_alive(detached)
    assert processes_with(marker) == []
    assert status(job) == JobStatus.STOPPED
    assert executor.poll([attempt.job_ref])[attempt.job_ref].native_state == "KILLED"


def processes_with(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and process_alive(int(proc.name)):
            found.append(int(proc.name))
    return found
