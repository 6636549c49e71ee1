"""Preemption's writes: the notice on a borrower's attempt, its end as a pause, and queueing the
paused job again.

Taking lent GPUs back, in three steps, each written here and nowhere else:
1. `send_notices`: the scheduler's lending (`jobs.loops.lending`) chose the victims; each
   victim's attempt is marked once (`Attempt.preempted_at`, the one flag: written here alone,
   `tests/structure/test_preemption_has_one_writer.py`), with a note on both sides, and after
   commit its engine is told (SIGTERM now, SIGKILL after its cluster's grace). The victim keeps
   its GPUs until it ends.
2. `pause`: the reconciler saw the victim's attempt end, or vanish, after its notice: it ends
   PAUSED through `jobs.ledger.ends` (billed to its end as run), whatever its exit, since it was
   told to stop; no retry is spent.
3. `requeue`: the scheduler's next tick queues the jobs a preemption paused again, to resume
   from their checkpoint; those a person, a window or a resume took over since are theirs
   (`jobs.reads.preemption`).
"""

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from django.db import transaction

from jobs import kick
from jobs.durations import say
from jobs.executors import executor_for
from jobs.executors.base import deliver_notice, preempt_grace_s
from jobs.ledger import ends
from jobs.ledger.transitions import Change, apply_transitions
from jobs.models import Attempt, Cluster, JobEvent
from jobs.reads.preemption import PAUSED_REASON, Borrower, paused_jobs
from jobs.states import JobStatus

log = logging.getLogger(__name__)
S = JobStatus
REQUEUE_REASON = "resuming after preemption; waiting for the scheduler"


@dataclass(frozen=True)
class Notice:
    """Borrowers told to give their GPUs back, for one waiting job of their lender."""

    job: int  # the lender's job that needs them
    lender: str  # the lending team's name: only its own job's note names it
    victims: Sequence[Borrower]


def send_notices(
    notices: Sequence[Notice], clusters: Mapping[int, Cluster], now: dt.datetime
) -> list[int]:
    """Mark each victim's attempt preempted at `now` (once: one that ended, or was told, since
    the tick read it is told nothing), note it on both sides, and give the notices after
    commit. Returns the victims' job ids."""
    sent: list[int] = []
    events: list[JobEvent] = []
    deliver: list[tuple[Cluster, str, int]] = []
    for notice in notices:
        for victim in notice.victims:
            marked = Attempt.objects.filter(
                pk=victim.attempt, preempted_at__isnull=True, end_time__isnull=True
            ).update(preempted_at=now, preempted_for_id=notice.job)
            if not marked:
                continue
            grace = preempt_grace_s(clusters[victim.cluster].settings)
            sent.append(victim.job)
            deliver.append((clusters[victim.cluster], victim.job_ref, grace))
            events.append(_victim_note(victim, grace))
        if notice.victims:
            events.append(_lender_note(notice))
    JobEvent.objects.bulk_create(events)
    if deliver:
        transaction.on_commit(partial(_deliver, deliver))
    return sent


def _victim_note(victim: Borrower, grace: int) -> JobEvent:
    # Short enough for the Events tab's column (160 characters); the lender unnamed, as
    # everywhere the borrower reads.
    reason = (
        f"preemption notice: the lending team needs back the {victim.total_gpus} GPUs this job "
        f"borrowed; SIGTERM now, SIGKILL in {say(grace)}; then PAUSED and queued again"
    )
    return _note(victim.job, reason, gpus=victim.total_gpus, grace_s=grace)


def _lender_note(notice: Notice) -> JobEvent:
    total_gpus = sum(v.total_gpus for v in notice.victims)
    reason = (
        f"preempting {len(notice.victims)} job(s) on {total_gpus} GPUs that other teams borrowed "
        f"from team {notice.lender}: this job needs them back"
    )
    return _note(notice.job, reason, victims=len(notice.victims), gpus=total_gpus)


def _note(job_id: int, reason: str, **data: int) -> JobEvent:
    return JobEvent(
        job_id=job_id, kind=JobEvent.Kind.NOTE, actor="scheduler", reason=reason, data=data
    )


def _deliver(deliver: list[tuple[Cluster, str, int]]) -> None:
    for cluster, job_ref, grace in deliver:
        try:
            deliver_notice(executor_for(cluster), job_ref, grace)
        except Exception:  # the reconciler cancels it when the grace is over, notice or not
            log.exception("preemption notice to %s failed", job_ref)


def pause(
    attempt: Attempt,
    now: dt.datetime,
    *,
    end: dt.datetime | None = None,
    started: dt.datetime | None = None,
    code: int | None = None,
    engine: ends.EngineTimes = ends.NOT_REPORTED,
) -> None:
    """A preempted attempt ended (`end`, `started` and `code` as its engine reported them, and
    the engine's own start and end, which cap the bill as for any end; None: it vanished):
    billed to its end as run, its job PAUSED with `PAUSED_REASON`, and a scheduler tick asked
    for to queue it again."""
    ends.end_attempt(
        attempt,
        ends.End(
            S.PAUSED,
            PAUSED_REASON,
            at=end,
            started=started,
            exit_code=code,
            engine=ends.EngineTimes(*engine),
        ),
        now,
    )
    transaction.on_commit(kick.scheduler)


def requeue() -> list[int]:
    """The jobs a preemption paused go back on the queue, to resume from their checkpoint; a
    resume from a preemption is no retry, so no retry budget is spent. Those that moved on
    meanwhile (a person's stop) are left as they are."""
    ids = paused_jobs()
    if not ids:
        return []
    changed, _ = apply_transitions(
        S.QUEUED,
        [Change(pk, REQUEUE_REASON) for pk in ids],
        actor="scheduler",
        expected={S.PAUSED},
    )
    return [job.pk for job in changed]
