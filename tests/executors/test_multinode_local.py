"""Multi-node jobs on the local executor, for real: the runner starts every rank as a process
group on this host with its own GPU slots and the rank contract, numbers their lines into one
log (each marked with its rank), ends every rank as soon as one fails, and writes one record."""

import contextlib
import datetime as dt
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from sf.contract import read_json

from jobs.actions import control
from jobs.executors.local import LocalExecutor
from jobs.loops.reconciler import reconcile_all
from jobs.models import Job
from jobs.states import JobStatus
from jobs.stores import logstore
from metering.models import UsageRecord
from metering.records import ENGINE_END_GRACE, meter_ended
from metering.usage import job_gpu_seconds
from tests.factories import queued_job
from tests.local_jobs import finished, run_until, start
from tests.processes import job_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("local_jobs")]
S = JobStatus

CONTRACT = (
    "SF_NODE_RANK SF_NUM_NODES SF_GPUS_PER_NODE SF_MASTER_ADDR SF_MASTER_PORT SF_NODE_ADDRS "
    "MASTER_ADDR MASTER_PORT NODE_RANK WORLD_SIZE PET_NNODES PET_NODE_RANK PET_NPROC_PER_NODE "
    "PET_MASTER_ADDR PET_MASTER_PORT CUDA_VISIBLE_DEVICES"
).split()


def gang_job(team, user, code: str, nodes: int = 2, gpus_per_node: int = 2) -> Job:
    return queued_job(
        team,
        user,
        total_gpus=nodes * gpus_per_node,
        nodes=nodes,
        entrypoint=[sys.executable, "-c", code],
    )


def lines(job: Job) -> list[dict]:
    return [json.loads(raw) for raw in logstore.read(job.pk, None, 10_000).raw_lines]


def test_every_rank_gets_the_contract_and_its_own_slots(team, alice):
    code = (
        "import json, os\n"
        f"print(json.dumps({{k: os.environ.get(k) for k in {CONTRACT!r}}}))\n"
        "print('secret seen:', 'SF_JOB_TOKEN' in os.environ or 'SF_RANK_GPUS' in os.environ)"
    )
    job = gang_job(team, alice, code)
    start(job)
    run_until(lambda: finished(job))
    job.refresh_from_db()
    assert job.status == S.SUCCEEDED, job.status_reason
    got = lines(job)
    envs = {ln["rank"]: json.loads(ln["text"]) for ln in got if ln["text"].startswith("{")}
    assert sorted(envs) == [0, 1]
    for rank, env in envs.items():
        assert env["SF_NODE_RANK"] == env["NODE_RANK"] == env["PET_NODE_RANK"] == str(rank)
        assert env["SF_NUM_NODES"] == env["WORLD_SIZE"] == env["PET_NNODES"] == "2"
        assert env["SF_GPUS_PER_NODE"] == env["PET_NPROC_PER_NODE"] == "2"
        assert env["MASTER_ADDR"] == env["SF_MASTER_ADDR"] == "127.0.0.1"
        assert env["SF_NODE_ADDRS"] == "127.0.0.1,127.0.0.1"
        assert env["MASTER_PORT"] == envs[0]["MASTER_PORT"] == env["PET_MASTER_PORT"]
    assert sorted(env["CUDA_VISIBLE_DEVICES"] for env in envs.values()) == ["0,1", "2,3"]
    assert [ln["text"] for ln in got if ln["text"].startswith("secret")] == [
        "secret seen: False"
    ] * 2
    ranks = job.current_attempt.ranks
    assert [(r["rank"], r["state"], r["exit_code"]) for r in ranks] == [
        (0, "succeeded", 0),
        (1, "succeeded", 0),
    ]


def test_ranks_really_talk_over_tcp_to_rank_0(team, alice):
    # Rank 0 listens on MASTER_PORT; rank 1 connects, sends its number, reads the sum back.
    code = (
        "import os, socket, time\n"
        "rank, port = int(os.environ['NODE_RANK']), int(os.environ['MASTER_PORT'])\n"
        "if rank == 0:\n"
        "    s = socket.create_server((os.environ['MASTER_ADDR'], port)); c, _ = s.accept()\n"
        "    v = int(c.recv(64)); c.sendall(str(v + 10).encode()); print('sum', v + 10)\n"
        "else:\n"
        "    for _ in range(100):\n"
        "        try: c = socket.create_connection((os.environ['MASTER_ADDR'], port)); break\n"
        "        except OSError: time.sleep(0.1)\n"
        "    c.sendall(b'5'); print('got', c.recv(64).decode())\n"
    )
    job = gang_job(team, alice, code, gpus_per_node=0)
    start(job)
    run_until(lambda: finished(job))
    job.refresh_from_db()
    assert job.status == S.SUCCEEDED, job.status_reason
    assert sorted((ln["rank"], ln["text"]) for ln in lines(job)) == [(0, "sum 15"), (1, "got 15")]


def test_one_rank_failing_ends_every_rank_fast_with_its_code_and_lines(team, alice):
    code = (
        "import os, sys, time\n"
        "if os.environ['NODE_RANK'] == '1':\n"
        "    print('rank one loading'); print('bad shard', flush=True); time.sleep(0.5)\n"
        "    sys.exit(7)\n"
        "print('rank zero training', os.getpid(), flush=True); time.sleep(120)\n"
    )
    job = gang_job(team, alice, code)
    start(job)
    began = time.monotonic()
    run_until(lambda: finished(job), timeout=40)
    took = time.monotonic() - began
    job.refresh_from_db()
    attempt = job.current_attempt
    assert job.status == S.FAILED and attempt.exit_code == 7
    assert job.status_reason.startswith("rank 1 on ")
    assert "exited with code 7; every other rank was ended" in job.status_reason
    assert job.status_reason.endswith("its last lines:\nrank one loading\nbad shard")
    states = [(r["rank"], r["state"], r["exit_code"]) for r in attempt.ranks]
    assert states[1] == (1, "failed", 7) and states[0][1] == "killed"
    assert not job_processes(job.run_id)
    assert took < 20


def test_gpu_seconds_count_every_node(team, alice):
    job = gang_job(team, alice, "import time; time.sleep(1)", nodes=2, gpus_per_node=2)
    start(job)
    run_until(lambda: finished(job))
    job.refresh_from_db()
    attempt = job.current_attempt
    ran = (attempt.end_time - attempt.start_time).total_seconds()
    assert attempt.total_gpus == 4 and attempt.nodes == 2
    assert job_gpu_seconds(job.attempts.all()) == pytest.approx(ran * 4, abs=1e-3)


@pytest.fixture(autouse=True)
def _end_every_rank(settings, local_jobs):
    """The module's cleanup ends rank 0's group; end every rank's before the next test."""
    # After local_jobs, so torn down before it and before job_dirs removes the started.json files.
    yield
    for started in Path(settings.SF_LOCAL_STATE_DIR).glob("*/*/started.json"):
        for pgid in read_json(started).get("pids") or []:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(pgid, signal.SIGKILL)


def rank_pids(job: Job) -> dict[int, int]:
    """{rank: pid} from lines the ranks print as `pid <rank> <pid>` (in the job's own PID
    namespace where it has one: `tests.processes` finds them on the host)."""
    found = {}
    for line in lines(job):
        if line["text"].startswith("pid "):
            _, rank, pid = line["text"].split()
            found[int(rank)] = int(pid)
    return found


SLEEPER = (
    "import os, time\n"
    "print('pid', os.environ['NODE_RANK'], os.getpid(), flush=True)\n"
    "time.sleep(120)\n"
)


def test_stop_ends_every_rank(team, alice):
    job = gang_job(team, alice, SLEEPER)
    start(job)
    run_until(lambda: Job.objects.get(pk=job.pk).status == S.RUNNING and len(rank_pids(job)) == 2)
    assert len(job_processes(job.run_id)) >= 2
    control.stop_job(User.objects.get(username="alice"), job.pk)
    deadline = time.monotonic() + 20
    while job_processes(job.run_id) and time.monotonic() < deadline:
        reconcile_all()
        time.sleep(0.2)
    assert not job_processes(job.run_id)
    assert Job.objects.get(pk=job.pk).status == S.STOPPED


def test_pause_and_resume_restart_every_rank_from_the_shared_checkpoint(team, alice):
    # Attempt 1: rank 0 writes the checkpoint, then both ranks wait. Attempt 2: every rank
    # reads it from the one checkpoint directory of the run.
    code = (
        "import os, time\n"
        "ckpt = os.path.join(os.environ['SF_CHECKPOINT_DIR'], 'step')\n"
        "rank, attempt = os.environ['NODE_RANK'], os.environ['SF_ATTEMPT']\n"
        "if attempt != '1':\n"
        "    print('resumed', rank, attempt, open(ckpt).read(), flush=True); raise SystemExit\n"
        "if rank == '0':\n"
        "    os.makedirs(os.path.dirname(ckpt), exist_ok=True); open(ckpt, 'w').write('41')\n"
        "print('pid', rank, os.getpid(), flush=True); time.sleep(120)\n"
    )
    job = gang_job(team, alice, code)
    start(job)
    run_until(lambda: len(rank_pids(job)) == 2)
    alice_user = User.objects.get(username="alice")
    control.pause_job(alice_user, job.pk)
    run_until(lambda: Job.objects.get(pk=job.pk).status == S.PAUSED)
    assert not job_processes(job.run_id)
    control.resume_job(alice_user, job.pk)
    # Each tick schedules again: the paused runner keeps its slots until it has flushed.
    run_until(lambda: start(job) and finished(job))
    job.refresh_from_db()
    assert job.status == S.SUCCEEDED, job.status_reason
    # A launch may have found the paused runner still holding its slots: an attempt between.
    last = job.attempt_count
    assert last >= 2 and job.current_attempt.nodes == 2
    resumed = sorted(ln["text"] for ln in lines(job) if ln["text"].startswith("resumed"))
    assert resumed == [f"resumed 0 {last} 41", f"resumed 1 {last} 41"]


def test_a_runner_killed_under_its_ranks_leaves_none_of_them(team, alice, local_cluster):
    job = gang_job(team, alice, SLEEPER)
    [attempt] = start(job)
    run_until(lambda: len(rank_pids(job)) == 2)
    attempt_dir = LocalExecutor(local_cluster).root / attempt.job_ref
    assert len(job_processes(job.run_id)) >= 2
    os.kill(read_json(attempt_dir / "proc.json")["pid"], signal.SIGKILL)
    run_until(lambda: finished(job), timeout=40)
    job.refresh_from_db()
    assert job.status == S.FAILED
    assert not job_processes(job.run_id)


def test_check_usage_agrees_with_a_gang_jobs_gpu_seconds(team, alice):
    job = gang_job(team, alice, "print('done')", nodes=3, gpus_per_node=1)
    start(job)
    run_until(lambda: finished(job))
    # The local executor keeps no record of its own: its attempts wait out the grace in which
    # an engine's end could still bound them.
    meter_ended(now=dt.datetime.now(dt.UTC) + ENGINE_END_GRACE)
    out = io.StringIO()
    call_command("check_usage", stdout=out)
    assert out.getvalue() == "usage records agree with 1 metered attempts\n"
    attempt = Job.objects.get(pk=job.pk).current_attempt
    ran_us = (attempt.end_time - attempt.start_time) // dt.timedelta(microseconds=1)
    assert UsageRecord.objects.get().gpu_us == ran_us * 3
