"""The local executor for real: the runner as a process group, talking to a live API server.

Covers the path scheduler → launcher → local executor → runner → log ingest → reconciler, plus
what the executor promises on its own: one process per attempt, state that survives a new
executor instance (a worker restart), GPU slots through CUDA_VISIBLE_DEVICES, and stop.

Run as root, these jobs run under their team's uid (run_as's default), as in CI.
"""

import dataclasses
import os
import signal
import sys
import time

import pytest
from django.contrib.auth.models import User
from sf.contract import read_json

from jobs.actions import control
from jobs.executors.local import LocalExecutor
from jobs.loops.launcher import launch_attempts, launch_spec
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job, JobEvent
from jobs.reads.ledgercheck import violations
from jobs.states import JobStatus
from tests.factories import queued_job
from tests.local_jobs import finished, process_alive, python_job, run_until, start, texts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("local_jobs")]
S = JobStatus


def test_job_runs_to_succeeded_with_its_logs_and_a_closed_attempt(team, alice):
    job = python_job(
        team,
        alice,
        "import sys\nfor i in range(3): print('line', i)\nprint('oops', file=sys.stderr)",
    )
    start(job)
    run_until(lambda: finished(job))
    job.refresh_from_db()
    attempt = job.current_attempt
    assert job.status == S.SUCCEEDED
    assert (attempt.exit_code, attempt.start_time <= attempt.end_time) == (0, True)
    assert sorted(texts(job)) == ["line 0", "line 1", "line 2", "oops"]
    path = list(JobEvent.objects.filter(job=job).order_by("pk").values_list("to_status", flat=True))
    assert path == [S.SUBMITTED, S.PENDING, S.RUNNING, S.SUCCEEDED]


def test_nonzero_exit_fails_with_the_code_and_last_lines(team, alice):
    job = python_job(team, alice, "print('loading data')\nprint('bad shape')\nraise SystemExit(3)")
    start(job)
    run_until(lambda: finished(job))
    job.refresh_from_db()
    assert job.status == S.FAILED and job.current_attempt.exit_code == 3
    assert job.status_reason == "exited with code 3; last lines:\nloading data\nbad shape"


def test_missing_snapshot_is_an_ingest_failure_not_a_user_error(team, alice):
    from jobs.models import Snapshot

    snap = Snapshot.objects.create(sha256="0" * 64, size=1)  # row without a stored blob
    job = queued_job(team, alice, snapshot=snap, entrypoint=["python", "train.py"])
    start(job)
    run_until(lambda: finished(job))
    job.refresh_from_db()
    assert job.status == S.FAILED and job.status_reason.startswith("ingest failed")
    assert job.current_attempt.start_time is None  # user code never ran: nothing metered


def test_each_job_gets_its_own_gpu_slots(team, alice):
    # Each lives a few seconds, so the two hold their slots at the same time.
    code = "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); time.sleep(3)"
    jobs = [
        python_job(team, alice, code, total_gpus=2),
        python_job(team, alice, code, total_gpus=2),
    ]
    start(*jobs)
    run_until(lambda: all(finished(j) for j in jobs))
    slots = [texts(j)[0] for j in jobs]
    assert sorted(slots) == ["0,1", "2,3"]


def test_state_survives_a_new_executor_instance_and_submit_adopts(team, alice, local_cluster):
    job = python_job(team, alice, "import time; time.sleep(30)")
    [attempt] = start(job)
    restarted = LocalExecutor(local_cluster)  # as a freshly started worker would build it
    assert restarted.submit(launch_spec(job, attempt)) == attempt.job_ref
    run_until(lambda: Job.objects.get(pk=job.pk).status == S.RUNNING)
    assert restarted.poll([attempt.job_ref])[attempt.job_ref].native_state == "RUNNING"
    pids = {p.name for p in (restarted.root).iterdir() if p.is_dir()}
    assert pids == {attempt.job_ref}
    control.stop_job(User.objects.get(username="alice"), job.pk)


def test_stop_ends_the_process_on_the_backend(team, alice, local_cluster):
    job = python_job(team, alice, "import time; print('up', flush=True); time.sleep(60)")
    [attempt] = start(job)
    run_until(lambda: Job.objects.get(pk=job.pk).status == S.RUNNING)
    proc = read_json(LocalExecutor(local_cluster).root / attempt.job_ref / "proc.json")
    control.stop_job(User.objects.get(username="alice"), job.pk)
    deadline = time.monotonic() + 15
    while process_alive(proc["pid"]) and time.monotonic() < deadline:
        reconcile_all()
        time.sleep(0.2)
    assert not process_alive(proc["pid"])
    assert Job.objects.get(pk=job.pk).status == S.STOPPED


def test_runner_killed_without_exit_status_fails_the_job(team, alice, local_cluster):
    job = python_job(team, alice, "import time; time.sleep(60)")
    [attempt] = start(job)
    run_until(lambda: Job.objects.get(pk=job.pk).status == S.RUNNING)
    attempt_dir = LocalExecutor(local_cluster).root / attempt.job_ref
    os.killpg(read_json(attempt_dir / "proc.json")["pid"], signal.SIGKILL)
    os.killpg(read_json(attempt_dir / "started.json")["pid"], signal.SIGKILL)
    run_until(lambda: finished(job))
    job.refresh_from_db()
    assert job.status == S.FAILED and "left no exit status" in job.status_reason


def test_python_on_the_path_is_the_servers_interpreter(team, alice):
    job = queued_job(
        team, alice, total_gpus=0, entrypoint=["python", "-c", "import sys; print(sys.executable)"]
    )
    start(job)
    run_until(lambda: finished(job))
    assert texts(job) == [sys.executable]


def test_directory_abandoned_before_the_runner_started_is_launched_not_adopted(
    team, alice, local_cluster
):
    job = python_job(team, alice, "print('ran')", total_gpus=0)
    [attempt_id] = admit_queued_jobs().admitted
    attempt = Attempt.objects.get(pk=attempt_id)
    executor = LocalExecutor(local_cluster)
    (executor.root / attempt.backend_name).mkdir()  # a worker died right after claiming it
    assert executor.find(attempt.backend_name) is None
    launch_attempts([attempt_id])
    run_until(lambda: finished(job))
    assert Job.objects.get(pk=job.pk).status == S.SUCCEEDED


def test_live_runner_not_yet_recorded_is_adopted_not_launched_twice(team, alice, local_cluster):
    import subprocess

    job = python_job(team, alice, "print('never')", total_gpus=0)
    [attempt_id] = admit_queued_jobs().admitted
    attempt = Attempt.objects.get(pk=attempt_id)
    attempt_dir = LocalExecutor(local_cluster).root / attempt.backend_name
    attempt_dir.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, sys, time\n"
                f"f = open({str(attempt_dir / 'alive.lock')!r}, 'w')\n"
                "fcntl.flock(f, fcntl.LOCK_EX)\n"
                "print('locked', flush=True); time.sleep(30)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"  # a runner that has not written yet
        executor = LocalExecutor(local_cluster)
        assert executor.find(attempt.backend_name) == attempt.backend_name
        assert executor.submit(launch_spec(job, attempt)) == attempt.backend_name
        assert not (attempt_dir / "proc.json").exists()  # nothing was launched a second time
        assert (
            executor.poll([attempt.backend_name])[attempt.backend_name].native_state == "STARTING"
        )
    finally:
        holder.kill()
        holder.wait()
    assert executor.poll([attempt.backend_name])[attempt.backend_name].native_state == "DIED"


def test_check_ledger_reports_a_live_runner_that_no_attempt_launched(team, alice, local_cluster):
    job = python_job(team, alice, "import time; time.sleep(60)")
    [attempt] = start(job)
    run_until(lambda: Job.objects.get(pk=job.pk).status == S.RUNNING)
    assert [v for v in violations() if "backend object" in v] == []
    # A launch the ledger never recorded (say, an attempt row lost to a restore from backup).
    ghost = dataclasses.replace(launch_spec(job, attempt), name="sf-ghost-a1")
    LocalExecutor(local_cluster).submit(ghost)
    found = [v for v in violations() if "backend object" in v]
    assert len(found) == 1 and found[0].startswith(
        "cluster local: backend object sf-ghost-a1 is "
    ), found
    assert found[0].endswith("but no attempt in the ledger launched it")
    LocalExecutor(local_cluster).cancel("sf-ghost-a1")
    control.stop_job(User.objects.get(username="alice"), job.pk)
