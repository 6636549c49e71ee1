"""The one way an attempt ends, whoever saw or decided it, for every state it ends in.

An end closes the attempt's clocks once (`jobs.ledger.clocks`: a start the engine reported, an
end bounded by the last sighting alive and now), records its cause on the attempt (end reason,
exit code, failure; a note on how the end was learnt when that was unusual), moves the job
through `jobs.ledger.transitions` (along the states it has not passed yet), and runs what
follows, decided once because the close is (`jobs.ledger.lifecycle`):

- SUCCEEDED: the follow-on jobs are created;
- FAILED: an automatic retry is planned, or a note says why not; the follow-ons are not created;
- STOPPED: a note says the follow-ons were not created (a FAILED job said so when it failed,
  unless it was waiting for an automatic retry);
- PAUSED, QUEUED: nothing follows (a resume, or the next launch, may still succeed).

Three doors, one road:
- `end_attempt`: an end the engine reported or the reconciler found (an exit, a loss, a pending
  deadline, an engine's time limit or cancel), and a preempted attempt's end
  (`jobs.ledger.preemption`);
- `end_group`: many of those at once, the reconciler's groups of common news;
- `end_decided`: the server's own decision, at its clock: a stop or a pause (`jobs.ledger.halt`,
  whoever asks) and a launch that failed (`jobs.loops.launcher`).

Nothing else closes an attempt or moves a job to an end
(`tests/structure/test_attempt_ends_have_one_owner.py`).
"""

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from jobs.ledger import clocks, lifecycle
from jobs.ledger.transitions import (
    Change,
    Moved,
    TransitionRefused,
    advance,
    apply_transitions,
    walk,
)
from jobs.models import Attempt, Job, JobEvent
from jobs.states import JobStatus

S = JobStatus
# What `end_decided` reads of a job, under its row lock.
READ_FIELDS = ("id", "status", "next_attempt_at", "attempt_count", "current_attempt_id", "then")


# The engine's own times an end carries (`jobs.ledger.clocks`), for the callers of an end.
EngineTimes = clocks.EngineTimes
NOT_REPORTED = clocks.NOT_REPORTED


@dataclass(frozen=True)
class End:
    """How an attempt ended, as its engine reported it or the reconciler found it."""

    target: JobStatus
    reason: str  # the job's status reason and the attempt's end reason
    at: dt.datetime | None = None  # the engine's end; None: unknown (the server's now)
    started: dt.datetime | None = None  # the engine's start, where it reported one
    exit_code: int | None = None
    failure: str = ""  # a FAILED end's cause (`sf.contract.Failure`): it decides the retry
    note: str = ""  # how the end was learnt, when that was unusual
    # The engine's own start and end (Slurm's Start/End, a pod's container run, Ray's job
    # times), where it reported them: kept on the attempt, and the bill never leaves them
    # (`jobs.ledger.clocks`).
    engine: EngineTimes = NOT_REPORTED


def end_attempt(attempt: Attempt, end: End, now: dt.datetime, *, actor: str = "reconciler") -> bool:
    """End the attempt as `end` says, once however many times it is observed; True when this
    call ended it. `attempt.job` is the job as the caller read it."""
    if end.started is not None:
        clocks.mark_started(attempt, end.started, now)
    if attempt.start_time is None and end.target == S.SUCCEEDED:
        _unknown_start(attempt, end.at or now, now, actor)
    path = _path(attempt, end.target)
    with transaction.atomic():
        closed = clocks.close(
            attempt,
            end.at,
            now,
            end.engine,
            exit_code=end.exit_code,
            end_reason=end.reason,
            failure=end.failure,
        )
        if not closed:
            return False
        if end.note:
            _note(attempt, end.note, actor)
        advance(attempt.job, path, end.reason, actor=actor, attempt=attempt.number)
        _follow(attempt.job, end.target, end.failure)
    return True


def end_group(attempts: Sequence[Attempt], ends: Mapping[int, End], now: dt.datetime) -> None:
    """`end_attempt` for each of `attempts` (`ends` by attempt pk: one target, reason and
    failure for them all, no note), in a few statements for them all: the reconciler's groups.

    Raises `Moved` where one could not end as `end_attempt` would end it alone (no start
    known, closed meanwhile, its job moved on): the caller rolls the group back and ends each
    on its own.
    """
    first = ends[attempts[0].pk]
    starts = {pk: end.started for pk, end in ends.items() if end.started is not None}
    clocks.mark_started_many(list(attempts), starts, now)
    if any(attempt.start_time is None for attempt in attempts):
        raise Moved("an attempt has no start")
    closed = clocks.close_many(
        list(attempts),
        {pk: end.at for pk, end in ends.items()},
        now,
        {pk: end.exit_code for pk, end in ends.items()},
        {pk: end.engine for pk, end in ends.items()},
        end_reason=first.reason,
        failure=first.failure,
    )
    if closed != len(attempts):
        raise Moved(f"{len(attempts) - closed} attempt(s) closed meanwhile")
    walk(attempts, [S.PENDING, S.RUNNING, first.target], first.reason, actor="reconciler")
    for attempt in attempts:
        _follow(attempt.job, first.target, first.failure)


def end_decided(
    jobs: Sequence[Job],
    target: JobStatus,
    reason: str,
    *,
    actor: str,
    now: dt.datetime,
    expected: Collection[str] | None = None,
    failure: str = "",
) -> tuple[list[int], list[TransitionRefused]]:
    """The server's own end of these jobs, at its clock: each moved to `target` where the table
    (and `expected`) allow it, its current attempt closed now with `reason` where still open,
    and what follows. `jobs` were read under their row locks (`READ_FIELDS`). Returns the ids
    moved, and the refusals."""
    with transaction.atomic():
        changes = [Change(job.pk, reason, attempt=job.attempt_count or None) for job in jobs]
        changed, refused = apply_transitions(target, changes, actor=actor, expected=expected)
        moved = {job.pk for job in changed}
        ended = [job for job in jobs if job.pk in moved]
        current = [a for job in ended if (a := job.current_attempt_id) is not None]
        clocks.close_open(current, now, reason)
        for job in ended:
            # A FAILED job ran what follows when it failed, unless it was waiting for an
            # automatic retry (which could still have succeeded).
            if job.status != S.FAILED or job.next_attempt_at is not None:
                _follow(job, target, failure)
    return [job.pk for job in ended], refused


def _path(attempt: Attempt, target: JobStatus) -> list[JobStatus]:
    """The states the job passes on its way to `target`: RUNNING if the attempt started."""
    if attempt.job.status == S.RUNNING:
        return [S.RUNNING, target]
    return [S.PENDING, S.RUNNING, target] if attempt.start_time else [S.PENDING, target]


def _follow(job: Job, target: JobStatus, failure: str) -> None:
    """What follows an end to `target` (see the module's docstring)."""
    if target == S.SUCCEEDED:
        if job.then:  # set at submit, never changed: none, nothing to make
            lifecycle.after_success(job.pk)
    elif target == S.FAILED:
        lifecycle.after_failure(job.pk, failure, timezone.now())
    elif target == S.STOPPED:
        lifecycle.not_succeeded(job, S.STOPPED)


def _unknown_start(attempt: Attempt, end: dt.datetime, now: dt.datetime, actor: str) -> None:
    """It ran (it succeeded) but nobody said when it started: bill nothing rather than guess.

    Billing from launch would count queued and pending time (docs/ARCHITECTURE.md, invariant 5).
    """
    clocks.mark_started(attempt, clocks.bounded_end(attempt, end, now), now)
    _note(
        attempt,
        "the backend reported the end but not the start, and the runner's start report did not "
        "arrive: this attempt is billed 0 GPU-seconds",
        actor,
    )


def _note(attempt: Attempt, reason: str, actor: str) -> None:
    JobEvent.objects.create(
        job_id=attempt.job_id,
        kind=JobEvent.Kind.NOTE,
        actor=actor,
        attempt=attempt.number,
        reason=reason,
    )
