"""A hang's retry keeps off the node that hung (issue 50, point 3), through the loops on a Slurm
whose answers come from a stand-in command runner: the reconciler keeps the node a single-node
attempt runs on, the watch's fail adds it to the job's `avoid_nodes` with a note, the scheduler
places the retry elsewhere and says so, and the launcher's sbatch carries `--exclude`. A second
hang on the other node of a two-node partition keeps off that one alone: keeping off both would
leave the job nowhere to run. Other engines keep nothing. The real two-node Slurm proof is
tests/engines/slurm/test_hung_node_avoided.py."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.executors.slurm import SlurmExecutor
from jobs.executors.slurm import executor as slurm_executor
from jobs.loops.activity import watch_activity
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import ActivityPolicy, Attempt, Cluster, Job, JobEvent
from jobs.reads.activity import DUMP_WAIT_S
from jobs.states import JobStatus
from tests.engines.slurm.helpers import FakeSlurm
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus
HANG_AFTER_S = 30
MULTI = (
    "multi1|multi|idle|gpu:a100:2(S:0)|gpu:a100:0(IDX:N/A)|\n"
    "multi2|multi|idle|gpu:a100:2(S:0)|gpu:a100:0(IDX:N/A)|\n"
)


@pytest.fixture
def fake(use_executor, monkeypatch) -> FakeSlurm:
    monkeypatch.setattr(slurm_executor, "CAPACITY_TTL_S", 0)
    monkeypatch.setattr(slurm_executor, "_capacities", {})
    fake = FakeSlurm()
    fake.answer("sinfo", MULTI)
    use_executor(lambda cluster: SlurmExecutor(cluster, run=fake))
    return fake


@pytest.fixture
def job(fake, team, alice, tmp_path) -> Job:
    settings = {"work_dir": str(tmp_path), "partition": "multi"}
    cluster = Cluster.objects.create(name="hpc", kind="slurm", settings=settings)
    ActivityPolicy.objects.create(team=team, hang_after_s=HANG_AFTER_S, hang_action="fail")
    return queued_job(team, alice, cluster=cluster, max_retries=2, retry_cooldown_s=0)


def admit_and_launch(fake: FakeSlurm, job_ref: str) -> Attempt:
    """A scheduler tick (the due retry queued and admitted) and the launch; the attempt."""
    fake.answer("squeue", "")  # no Starforge job holds a GPU on the nodes
    fake.answer("sbatch", f"{job_ref}\n")
    (attempt_id,) = admit_queued_jobs().admitted
    (outcome,) = launch_attempts([attempt_id])
    assert outcome.job_ref == job_ref, outcome.error
    return Attempt.objects.get(pk=attempt_id)


def runs_then_hangs(fake: FakeSlurm, attempt: Attempt, node: str) -> None:
    """Slurm runs the attempt on `node`; it makes no progress until the watch fails it."""
    start = int(timezone.now().timestamp()) - 1
    line = f"{attempt.job_ref}|RUNNING|None|{start}|N/A|0|{node}|{attempt.backend_name}|\n"
    fake.answer("squeue", line)
    reconcile_all()
    attempt.refresh_from_db()
    assert attempt.ranks == [{"rank": 0, "node": node, "state": "running", "exit_code": None}]
    later = attempt.start_time + dt.timedelta(seconds=HANG_AFTER_S + DUMP_WAIT_S + 1)
    assert watch_activity(later).hung == [attempt.job_id]
    attempt.refresh_from_db()
    assert attempt.failure == "hung"


def sbatch_calls(fake: FakeSlurm) -> list[list[str]]:
    return [call for call in fake.calls if call[0] == "sbatch"]


def excluded(call: list[str]) -> list[str]:
    return [arg for arg in call if arg.startswith("--exclude")]


def last_admission(job: Job) -> JobEvent:
    return JobEvent.objects.filter(job=job, to_status=S.SUBMITTED).latest("id")


def test_the_retry_of_a_hung_attempt_keeps_off_the_node_it_hung_on(fake, job):
    first = admit_and_launch(fake, "101")
    assert excluded(sbatch_calls(fake)[0]) == []
    runs_then_hangs(fake, first, "multi1")
    job.refresh_from_db()
    assert job.avoid_nodes == ["multi1"] and job.next_attempt_at is not None
    (note,) = JobEvent.objects.filter(job=job, reason__startswith="its retries avoid")
    assert note.reason.startswith("its retries avoid node multi1, which hung attempt 1 ran on")
    assert note.data == {"avoid_nodes": ["multi1"], "hung_attempt": 1}

    admit_and_launch(fake, "102")
    assert excluded(sbatch_calls(fake)[1]) == ["--exclude=multi1"]
    event = last_admission(job)
    assert event.data["kept_off"] == ["multi1"] and event.data["not_kept_off"] == []
    assert "kept off multi1, where an attempt of it hung" in event.reason


def test_a_second_hang_keeps_off_the_newest_node_alone_where_two_would_leave_none(fake, job):
    runs_then_hangs(fake, admit_and_launch(fake, "101"), "multi1")
    runs_then_hangs(fake, admit_and_launch(fake, "102"), "multi2")
    job.refresh_from_db()
    assert job.avoid_nodes == ["multi1", "multi2"]
    admit_and_launch(fake, "103")
    assert excluded(sbatch_calls(fake)[2]) == ["--exclude=multi2"]
    event = last_admission(job)
    assert event.data["kept_off"] == ["multi2"] and event.data["not_kept_off"] == ["multi1"]
    assert "not kept off multi1" in event.reason and "too few" in event.reason


def test_a_retry_waits_for_a_node_other_than_the_one_that_hung(fake, job):
    runs_then_hangs(fake, admit_and_launch(fake, "101"), "multi1")
    busy = "multi2|multi|mixed|gpu:a100:2(S:0)|gpu:a100:2(IDX:0-1)|\n"
    fake.answer("sinfo", MULTI.splitlines(keepends=True)[0] + busy)
    fake.answer("squeue", "")
    assert admit_queued_jobs().admitted == []  # multi2's GPUs are held outside Starforge
    job.refresh_from_db()
    assert job.status == S.QUEUED
    assert job.status_reason.endswith("(kept off multi1, where an attempt of it hung)")


def test_a_hang_on_an_engine_that_cannot_keep_off_nodes_keeps_nothing(team, alice):
    ActivityPolicy.objects.create(team=team, hang_after_s=HANG_AFTER_S, hang_action="fail")
    job = queued_job(team, alice, max_retries=1)  # the local cluster
    ranks = [{"rank": 0, "node": "host1", "state": "running", "exit_code": None}]
    start = timezone.now() - dt.timedelta(seconds=5)
    attempt = with_attempt(job, S.RUNNING, start_time=start, ranks=ranks)
    later = start + dt.timedelta(seconds=HANG_AFTER_S + DUMP_WAIT_S + 1)
    assert watch_activity(later).hung == [job.pk]
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.failure == "hung" and job.next_attempt_at is not None
    assert job.avoid_nodes == []
    assert not JobEvent.objects.filter(job=job, reason__startswith="its retries avoid")
