"""What the ledger holds of lending and preemption, for the loops that decide and the pages that
show it: the attempts running on borrowed GPUs (a lender's possible victims), and which paused
jobs a preemption paused.

One fact, one flag: `Attempt.preempted_at`, when the scheduler told the attempt to give its
borrowed GPUs back (written by `jobs.ledger.preemption` alone). The attempt's end then pauses
its job with `PAUSED_REASON`, and the job is the preemption's, for the scheduler to queue again,
while it stays PAUSED with that reason and its current attempt bears the notice. A person's
pause or stop, a window's pause or a resume moves the job with a reason of its own, which takes
it off the preemption's hands (that is how each cleared the job's own flag once).
"""

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import F

from jobs.models import Attempt, Job
from jobs.states import JobStatus

S = JobStatus
# The status reason of a job a preemption paused. It names no lender: its team reads it (and
# its webhooks say it), and the lender is another team's.
PAUSED_REASON = "preempted: borrowed GPUs returned to the lending team"


@dataclass(frozen=True)
class Borrower:
    """An active attempt on borrowed GPUs: a possible victim when its lender wants them back."""

    attempt: int
    job: int
    lender: int
    cluster: int
    total_gpus: int
    priority: int
    job_ref: str
    started: dt.datetime | None
    checkpoint_at: dt.datetime | None
    preempted_at: dt.datetime | None

    def order(self) -> tuple:
        """Victims first: the lowest priority, then the most recent checkpoint (none: last),
        then the most recent start."""
        saved = -self.checkpoint_at.timestamp() if self.checkpoint_at else float("inf")
        started = -self.started.timestamp() if self.started else float("inf")
        return (self.priority, saved, started, self.job)


def borrowers() -> dict[int, list[Borrower]]:
    """Active attempts on borrowed GPUs, by lender, in one query."""
    rows = Attempt.objects.filter(
        borrowed_from__isnull=False,
        end_time__isnull=True,
        job__status__in=S.active(),
        job__current_attempt=F("pk"),
    ).values_list(
        "pk", "job_id", "borrowed_from_id", "job__cluster_id", "total_gpus", "job__priority",
        "job_ref", "start_time", "checkpoint_at", "preempted_at",
    )  # fmt: skip
    found: dict[int, list[Borrower]] = defaultdict(list)
    for row in rows:
        borrower = Borrower(*row)
        found[borrower.lender].append(borrower)
    return found


def paused_jobs(job_ids: Iterable[int] | None = None) -> list[int]:
    """The jobs a preemption paused (among `job_ids`, where given), in id order."""
    jobs = Job.objects.filter(
        status=S.PAUSED, status_reason=PAUSED_REASON, current_attempt__preempted_at__isnull=False
    )
    if job_ids is not None:
        jobs = jobs.filter(pk__in=list(job_ids))
    return list(jobs.order_by("pk").values_list("pk", flat=True))


def paused_by_preemption(job: Job, attempt: Attempt | None) -> bool:
    """`paused_jobs`' rule for a job read whole, with its current attempt."""
    return (
        job.status == S.PAUSED
        and job.status_reason == PAUSED_REASON
        and attempt is not None
        and attempt.preempted_at is not None
    )
