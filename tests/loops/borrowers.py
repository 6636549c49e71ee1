"""Borrowers on a fake engine and a controllable clock, for the tests of taking lent GPUs back
(tests/loops/test_preemption.py, tests/hostile/test_lender_figures.py): the engine records the
notices and cancels it was told, a tick admits at a given time, borrowers are put RUNNING from
their start, and a victim's end is reported and reconciled."""

import datetime as dt

from jobs.executors.base import Capacity, Observation
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job
from jobs.states import JobStatus
from tests.factories import queued_job

S = JobStatus
T0 = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)


class Engine:
    """A cluster of 16 GPUs whose jobs run until the test ends them; it records notices and
    cancels."""

    STATE_TABLE = {"RUNNING": S.RUNNING, "DONE": S.SUCCEEDED, "FAILED": S.FAILED}
    PREEMPT_BY_TERM = False
    notices: list[tuple[str, int]] = []
    cancels: list[str] = []
    ends: dict[str, Observation] = {}
    gone: set[str] = set()  # refs the engine no longer knows (a deleted Kubernetes Job)

    def __init__(self, cluster) -> None:
        pass

    def submit(self, spec):
        return f"ref-{spec.name}"

    def find(self, name):
        return None

    def poll(self, refs):
        return {r: self.ends.get(r, Observation("RUNNING")) for r in refs if r not in self.gone}

    def reap_stale(self, observations):
        return []

    def cancel(self, ref):
        self.cancels.append(ref)

    def preempt(self, ref, grace_s):
        self.notices.append((ref, grace_s))

    def starforge_objects(self):
        return {}

    def capacity(self):
        return Capacity(reachable=True, total_gpus=16)


def tick(at: dt.datetime, capture) -> None:
    with capture(execute=True):
        admit_queued_jobs(now=at)


def run_borrowers(team, user, capture, *specs) -> list[Job]:
    """Admit one job per (gpus, priority, started at, checkpoint at) on borrowed GPUs, and
    put each RUNNING since its start time (test setup, as the reconciler would)."""
    jobs = [queued_job(team, user, total_gpus=g, priority=p) for g, p, _, _ in specs]
    tick(T0 - dt.timedelta(hours=2), capture)
    for job, (_, _, started, saved) in zip(jobs, specs, strict=True):
        job.refresh_from_db()
        assert job.status == S.SUBMITTED and job.current_attempt.borrowed_from_id
        Attempt.objects.filter(pk=job.current_attempt_id).update(
            job_ref=f"ref-{job.current_attempt.backend_name}",
            start_time=started,
            pending_at=started,
            checkpoint_at=saved,
        )
        Job.objects.filter(pk=job.pk).update(status=S.RUNNING)
    return jobs


def ends(victim: Job, state: str, code: int, at_s: float) -> None:
    """The engine reports the victim's attempt ended `at_s` after T0; a reconcile 5 s later."""
    ref = f"ref-{victim.current_attempt.backend_name}"
    Engine.ends[ref] = Observation(state, exit_code=code, end_time=T0 + dt.timedelta(seconds=at_s))
    reconcile_all(now=T0 + dt.timedelta(seconds=at_s + 5))
