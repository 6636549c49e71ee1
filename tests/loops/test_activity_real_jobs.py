"""The activity watch on real local jobs (issue 50's proof): the runner reports what each rank
does, the server asks for stack dumps as a stall nears the team's hang_after, py-spy dumps every
rank's Python processes, and the watch step reports the hang, fails or pauses the job."""

import sys
import time

import pytest
from django.utils import timezone

from jobs.loops.activity import watch_activity
from jobs.loops.reconciler import reconcile_all
from jobs.models import ActivityPolicy, Job, JobEvent
from jobs.states import JobStatus
from tests.factories import queued_job
from tests.local_jobs import start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("local_jobs")]
SAMPLE_S = "0.3"  # the runner's report period in these tests (SF_SYSTEM_SAMPLE_S)
TICK_S = 0.5  # between the test's reconcile-and-watch ticks

HANGS = """
import time

def wait_for_the_other_side():
    while True:
        time.sleep(0.5)

print("ready", flush=True)
wait_for_the_other_side()
"""


def real_job(team, user, code: str, **fields) -> Job:
    env = {"SF_SYSTEM_SAMPLE_S": SAMPLE_S, **fields.pop("env", {})}
    return queued_job(
        team, user, total_gpus=1, entrypoint=[sys.executable, "-c", code], env=env, **fields
    )


def tick_until(predicate, timeout: float = 40.0) -> float:
    """Reconcile and watch every TICK_S until `predicate()`; the seconds it took."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        reconcile_all()
        watch_activity(timezone.now())
        if predicate():
            return time.monotonic() - began
        time.sleep(TICK_S)
    raise AssertionError("condition not reached in time")


def events(job: Job, prefix: str) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, reason__startswith=prefix).order_by("id"))


def test_a_job_waiting_forever_is_reported_hung_with_a_dump_naming_its_function(team, alice):
    ActivityPolicy.objects.create(team=team, hang_after_s=3)
    job = real_job(team, alice, HANGS)
    (attempt,) = start(job)
    tick_until(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING)
    tick_until(lambda: events(job, "suspected hang"))
    attempt.refresh_from_db()
    (hang,) = events(job, "suspected hang")
    stalled = (hang.time - attempt.start_time).total_seconds()
    assert stalled <= 3 + TICK_S + float(SAMPLE_S) + 2, stalled  # hang_after + one tick (+ start)
    (dump,) = hang.data["dumps"]
    assert dump["rank"] == 0 and "wait_for_the_other_side" in dump["text"], dump
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING  # notify: nothing more
    watch_activity(timezone.now())
    assert len(events(job, "suspected hang")) == 1  # once per stall


def test_hang_action_fail_fails_the_job_as_hung_and_retries_it(team, alice):
    ActivityPolicy.objects.create(team=team, hang_after_s=2, hang_action="fail")
    job = real_job(team, alice, HANGS, max_retries=1)
    start(job)
    tick_until(lambda: events(job, "suspected hang"))
    job.refresh_from_db()
    first = job.attempts.get(number=1)
    assert first.failure == "hung" and first.end_time is not None
    assert job.status in (JobStatus.FAILED, JobStatus.QUEUED), job.status
    assert "hang policy" in job.status_reason or job.status == JobStatus.QUEUED
    retried = JobEvent.objects.filter(job=job, to_status=JobStatus.QUEUED, attempt__gte=1)
    tick_until(lambda: retried.exists() or Job.objects.get(pk=job.pk).next_attempt_at)


SILENT = """
import time
time.sleep(600)
"""


def test_an_idle_job_is_warned_then_noticed_then_paused_in_that_order(team, alice):
    ActivityPolicy.objects.create(team=team, idle_after_s=2, idle_grace_s=2)
    job = real_job(team, alice, SILENT)
    start(job)
    tick_until(lambda: Job.objects.get(pk=job.pk).status == JobStatus.PAUSED)
    timeline = list(JobEvent.objects.filter(job=job).order_by("id"))
    warned = next(e for e in timeline if e.reason.startswith("idle for"))
    noticed = next(e for e in timeline if e.reason.startswith("checkpoint notice"))
    paused = next(e for e in timeline if e.to_status == JobStatus.PAUSED)
    assert warned.id < noticed.id < paused.id
    assert (noticed.time - warned.time).total_seconds() >= 2  # the team's idle grace
    job.refresh_from_db()
    assert "idle policy" in job.status_reason
    assert job.current_attempt.end_time is not None  # billing ended with the pause


DDP = """
import datetime, os, time
import torch
import torch.distributed as dist

def wait_before_all_reduce():
    while True:
        time.sleep(0.5)

rank = int(os.environ["NODE_RANK"])
dist.init_process_group(
    "gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
    timeout=datetime.timedelta(minutes=10),
)
print("up", flush=True)
if rank == 1:
    wait_before_all_reduce()
tensor = torch.ones(4)
dist.all_reduce(tensor)
"""


def test_a_ddp_job_whose_rank_1_stops_before_an_all_reduce_shows_both_ranks_stacks(
    team, alice, job_python
):
    ActivityPolicy.objects.create(team=team, hang_after_s=4)
    job = queued_job(
        team, alice, total_gpus=0, nodes=2, entrypoint=[str(job_python), "-c", DDP],
        env={"SF_SYSTEM_SAMPLE_S": SAMPLE_S},
    )  # fmt: skip
    start(job)
    tick_until(lambda: events(job, "suspected hang"), timeout=90)
    (hang,) = events(job, "suspected hang")
    dumps = {d["rank"]: d["text"] for d in hang.data["dumps"]}
    # A frame reads "    function (file:line)"; the header quotes the whole -c script.
    assert "    all_reduce (" in dumps[0], dumps[0]  # blocked in the collective
    assert "    wait_before_all_reduce (" in dumps[1], dumps[1]  # its own wait
    assert "    wait_before_all_reduce (" not in dumps[0]
