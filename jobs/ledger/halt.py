"""Halting jobs: the one way a job is stopped or paused, whoever asks (a person's stop or
pause, the budget's hard stop, a closing schedule window, a time limit, a departure).

Under the jobs' row locks, in one transaction: each job ends through `jobs.ledger.ends` (the
status through the transition function, docs/ARCHITECTURE.md, invariant 1; the current attempt
closed at the server's clock so billing ends now, invariant 5; a stop's note on the follow-ons
that will not be created), and a pending automatic retry is cancelled. After commit the backend
is told to cancel, so `stop` always kills (invariant 7); a failed cancel is retried by the
reconciler's orphan sweep.
"""

import datetime as dt
import logging
from collections.abc import Collection
from dataclasses import dataclass

from django.db import transaction

from jobs.executors import executor_for
from jobs.ledger.ends import READ_FIELDS, end_decided
from jobs.ledger.transitions import TransitionRefused
from jobs.models import Attempt, Job
from jobs.states import JobStatus

log = logging.getLogger(__name__)
S = JobStatus


@dataclass(frozen=True)
class Halted:
    halted: list[int]
    refused: list[TransitionRefused]


def halt(
    job_ids: list[int],
    target: JobStatus,
    reason: str,
    *,
    actor: str,
    now: dt.datetime,
    expected: Collection[str] | None = None,
    by_window: bool = False,
) -> Halted:
    """Stop or pause these jobs where the table (and `expected`) allow it.

    `by_window` marks a pause the scheduler made for a closed window, which it resumes when the
    window opens; a person's pause or stop is theirs, so it clears the mark. (A preemption's
    pause needs no clearing: the job's new reason takes it off the preemption's hands,
    `jobs.reads.preemption`.)
    """
    if not job_ids:
        return Halted([], [])
    with transaction.atomic():
        # Read under the rows' locks: a scheduler tick may have admitted a job (a new open
        # attempt) a moment ago, and that attempt is the one to close.
        before = {
            job.pk: job
            for job in Job.objects.select_for_update()
            .filter(pk__in=job_ids)
            .order_by("pk")
            .only(*READ_FIELDS)
        }
        halted, refused = end_decided(
            list(before.values()), target, reason, actor=actor, now=now, expected=expected
        )
        Job.objects.filter(pk__in=halted).update(next_attempt_at=None, paused_by_window=by_window)
        # Only an active job has something on its backend (its attempt is open from admission
        # to its end); the orphan sweep catches anything else.
        to_cancel = [pk for pk in halted if before[pk].status in S.active()]
        if to_cancel:
            transaction.on_commit(lambda: _cancel(to_cancel))
    return Halted(halted, refused)


def _cancel(job_ids: list[int]) -> None:
    for job_id in job_ids:
        try:
            cancel_current(job_id)
        except Exception:  # the reconciler's orphan sweep cancels it again on its next tick
            log.exception("cancel of job %s failed; the reconciler will retry", job_id)


def cancel_current(job_id: int) -> None:
    """Ask the backend to stop the job's current attempt, if it has a backend object."""
    current = Job.objects.filter(pk=job_id).values_list("current_attempt", flat=True).first()
    if current is not None:
        cancel_attempt(current)


def cancel_attempt(attempt_id: int) -> None:
    """Ask the backend to stop this attempt's backend object, if it has one (idempotent)."""
    attempt = Attempt.objects.select_related("job__cluster").filter(pk=attempt_id).first()
    if attempt is None:
        return
    executor = executor_for(attempt.job.cluster)
    ref = attempt.job_ref or executor.find(attempt.backend_name)
    if ref:
        executor.cancel(ref)
