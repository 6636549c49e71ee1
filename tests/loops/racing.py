"""Two schedulers racing over one queue while jobs end, for the quota's concurrency tests on
PostgreSQL (test_scheduler_concurrency) and on the embedded ledger (test_scheduler_turns)."""

import random

from django.db.models import Sum

from jobs.ledger.transitions import Change, apply_transitions
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Job
from jobs.states import JobStatus
from tests.factories import queued_job
from tests.threads import race

S = JobStatus


def _usage() -> dict[str, int]:
    rows = (
        Job.objects.filter(status__in=S.active())
        .values("team__name")
        .annotate(held=Sum("total_gpus"))
    )
    return {r["team__name"]: r["held"] for r in rows}


def _finish_some():
    """Churn: end a few active jobs so quota frees up and the schedulers keep admitting."""
    active = list(Job.objects.filter(status=S.SUBMITTED).values_list("pk", flat=True)[:50])
    done = random.sample(active, k=min(3, len(active)))
    apply_transitions(S.STOPPED, [Change(pk, "test churn") for pk in done], actor="test")


def race_two_schedulers(make_team, make_user, quotas: dict[str, int], jobs_per_team: int) -> list:
    """Two schedulers, churn and a sampler of what each team holds, racing until the queue is
    empty (the embedded ledger's: tests/loops/test_scheduler_turns.py). Asserts that
    no sample saw a team over its quota and that the churn let the schedulers admit many times
    over; returns the samples."""
    for name, quota in quotas.items():
        team = make_team(name, gpu_quota=quota)
        user = make_user(f"user-{name}", team)
        for n in range(jobs_per_team):
            queued_job(team, user, total_gpus=1 + n % 2)
    samples = []

    def sample():
        samples.append(_usage())

    steps = [admit_queued_jobs, admit_queued_jobs, _finish_some, sample]
    errors = race(steps, lambda: not Job.objects.filter(status=S.QUEUED).exists(), 200)
    assert errors == []
    samples.append(_usage())
    over = [(team, used) for s in samples for team, used in s.items() if used > quotas[team]]
    assert over == []
    admitted = Job.objects.exclude(status=S.QUEUED).count()
    assert admitted > sum(quotas.values())  # churn let the schedulers admit many times over
    return samples
