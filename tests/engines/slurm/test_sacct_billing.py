"""Never bill more than the engine (issue 50, point 0): a mixed workload through the ledger on
the real Slurm of `.ci/slurm.sh` (accounting on: slurmdbd on MariaDB), every attempt compared
with `sacct`'s own accounting, ElapsedRaw x gres/gpu of AllocTRES.

Jobs of 0, 1 and 2 fake GPUs, a failure, a stop, a pause and its resume, a two-node job: the
sum of Starforge's billed GPU-seconds (metering's figure) is at most Slurm's, and each attempt
lies within 1 s x its GPUs below Slurm's. The table is printed (pytest -s) for the notes.
"""

import time

import pytest

from jobs.actions import control
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Cluster, Job
from jobs.states import JobStatus
from metering.usage import attempt_gpu_seconds
from tests.engines.slurm.conftest import slurm
from tests.factories import queued_job

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]
S = JobStatus
FINAL = {S.SUCCEEDED, S.FAILED, S.STOPPED}
SLEEP = "import time; time.sleep({})"
# The paused job's first attempt waits to be paused; its resumed attempt runs briefly.
RESUMABLE = "import os, time; time.sleep(2 if os.environ['SF_ATTEMPT'] != '1' else 120)"


@pytest.fixture
def hpc(make_team, make_user, cluster_settings, settings):
    settings.SF_API_URL = ""  # offline runners: the comparison is about times, not logs
    debug = Cluster.objects.create(name="hpc", kind="slurm", settings=cluster_settings)
    multi = Cluster.objects.create(
        name="hpc-multi", kind="slurm", settings={**cluster_settings, "partition": "multi"}
    )
    team = make_team("physics", gpu_quota=16, cluster=debug)
    return team, make_user("bob", team), multi


def submit(team, user, token, label, code, gpus=1, **fields) -> Job:
    job = queued_job(team, user, total_gpus=gpus, entrypoint=["python", "-c", code], **fields)
    Job.objects.filter(pk=job.pk).update(run_id=f"{token}{label}")  # names the Slurm job
    return job


def tick() -> None:
    """What the scheduler, launcher and reconciler loops do, once."""
    admit_queued_jobs()
    todo = Attempt.objects.filter(job_ref="", end_time__isnull=True, job__status=S.SUBMITTED)
    if ids := list(todo.values_list("pk", flat=True)):
        launch_attempts(ids)
    reconcile_all()


def until(check, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"still waiting for {what}"
        tick()
        time.sleep(0.3)
    return found


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def sacct_rows(ids: list[str], conf: str) -> dict[str, tuple[str, int, int]]:
    """{Slurm job id: (State, ElapsedRaw, gres/gpu of AllocTRES)} once accounting has them all
    with their ends (slurmctld sends them to slurmdbd a moment after the job ends)."""
    fields = "JobID,State,ElapsedRaw,AllocTRES,End"
    deadline = time.monotonic() + 30
    while True:
        out = slurm("sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", fields, conf=conf)
        rows = {}
        for line in out.splitlines():
            job_id, state, elapsed, tres, end = line.split("|")
            tres_of = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
            if end not in ("", "Unknown") and job_id in ids:
                rows[job_id] = (state.split()[0], int(elapsed), int(tres_of.get("gres/gpu", 0)))
        if len(rows) == len(ids):
            return rows
        assert time.monotonic() < deadline, f"sacct has not all of {ids}: {out}"
        time.sleep(0.5)


def test_every_attempt_is_billed_within_a_second_below_slurms_accounting(
    hpc, token, slurm_conf, django_capture_on_commit_callbacks
):
    team, bob, multi = hpc
    jobs = [
        submit(team, bob, token, "a", SLEEP.format(2), gpus=1),
        submit(team, bob, token, "b", SLEEP.format(3), gpus=2),
        submit(team, bob, token, "c", SLEEP.format(1), gpus=0),
        submit(team, bob, token, "d", "import sys, time; time.sleep(1); sys.exit(3)", gpus=1),
        submit(team, bob, token, "m", SLEEP.format(2), gpus=2, nodes=2, cluster=multi),
    ]
    stopped = submit(team, bob, token, "s", SLEEP.format(120), gpus=2)
    paused = submit(team, bob, token, "p", RESUMABLE, gpus=1)
    with django_capture_on_commit_callbacks(execute=True):  # halt's cancel runs after commit
        until(lambda: status(stopped) == S.RUNNING and status(paused) == S.RUNNING, "running")
        time.sleep(1.5)
        control.stop_job(bob, stopped.pk)
        control.pause_job(bob, paused.pk)
    until(lambda: status(paused) == S.PAUSED, "the pause")
    until(lambda: not Attempt.objects.filter(job=paused, native_state="RUNNING"), "the cancel")
    control.resume_job(bob, paused.pk)
    everyone = [*jobs, stopped, paused]
    until(lambda: all(status(job) in FINAL for job in everyone), "every job's end", timeout=90)
    attempts = list(Attempt.objects.filter(job__in=everyone).order_by("job_id", "number"))
    refs = [a.job_ref for a in attempts]
    # the sweep of closed attempts learns the cancelled ones' engine times and final state
    until(lambda: all(a.engine_end for a in Attempt.objects.filter(job_ref__in=refs)), "ends")
    rows = sacct_rows(refs, slurm_conf)

    print(
        f"\n{'job':>5} {'att':>3} {'slurm id':>8} {'gpus':>4} {'ElapsedRaw':>10} "
        f"{'slurm GPU-s':>11} {'billed GPU-s':>12}  state"
    )
    billed_sum = slurm_sum = 0.0
    for attempt in Attempt.objects.filter(job_ref__in=refs).order_by("job_id", "number"):
        state, elapsed, gpus = rows[attempt.job_ref]
        assert gpus == attempt.total_gpus, attempt.job_ref
        billed = attempt_gpu_seconds(attempt.start_time, attempt.end_time, attempt.total_gpus)
        ours = elapsed * gpus
        print(
            f"{attempt.job_id:>5} {attempt.number:>3} {attempt.job_ref:>8} {gpus:>4} "
            f"{elapsed:>10} {ours:>11} {billed:>12.3f}  {state}/{attempt.native_state}"
        )
        assert attempt.native_state == state  # CANCELLED after a stop or a pause
        assert billed <= ours, f"attempt {attempt.job_ref} billed more than Slurm"
        assert ours - billed <= gpus * 1.0, f"attempt {attempt.job_ref} billed a second short"
        assert attempt.engine_start <= attempt.start_time <= attempt.end_time
        if attempt.native_state != "CANCELLED":  # ended by Slurm, not by the server's stop
            assert attempt.start_time == max(attempt.engine_start, attempt.submitted_at)
            assert attempt.end_time <= attempt.engine_end
        billed_sum += billed
        slurm_sum += ours
    print(f"sum: Slurm {slurm_sum:.0f} GPU-s, Starforge {billed_sum:.3f} GPU-s")
    assert billed_sum <= slurm_sum
    assert len(attempts) == 8 and {status(job) for job in everyone} == FINAL
    assert [a.native_state for a in Attempt.objects.filter(job=stopped)] == ["CANCELLED"]
    assert [a.native_state for a in Attempt.objects.filter(job=paused).order_by("number")] == [
        "CANCELLED",
        "COMPLETED",
    ]
