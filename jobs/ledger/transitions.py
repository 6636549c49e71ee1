"""The one place that writes `Job.status` (docs/ARCHITECTURE.md, invariant 1).

`apply_transitions` locks the job rows, checks the allowed-transition table, updates the rows
and writes one `JobEvent` per change, all in one transaction. `transition` is its single-job
form that raises when the change is refused; `advance` and `walk` take a job, or a group of
them, along a path of states, skipping those already passed. Each change is also pushed, after
commit, to the job's page group and the jobs list group (`jobs.broadcast`), and, in the same
transaction, written as the deliveries webhooks ask for (`jobs.ledger.outbox`).
"""

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from jobs import broadcast
from jobs.ledger import outbox
from jobs.models import Attempt, Job, JobEvent
from jobs.states import JobStatus, is_allowed


class TransitionRefused(Exception):
    """The table (or the caller's expectation) forbids the change; nothing was written."""

    def __init__(self, job_id: int, current: str, target: str, why: str = "") -> None:
        self.job_id, self.current, self.target = job_id, current, target
        why = why or f"a {current} job cannot become {target}"
        super().__init__(f"job {job_id} is {current}: {why}")


@dataclass(frozen=True)
class Change:
    job_id: int
    reason: str = ""
    attempt: int | None = None
    data: dict = field(default_factory=dict)


def apply_transitions(
    target: JobStatus,
    changes: Sequence[Change],
    *,
    actor: str,
    expected: Collection[str] | None = None,
) -> tuple[list[Job], list[TransitionRefused]]:
    """Move every job in `changes` to `target` where the table (and `expected`) allow it.

    Returns the changed jobs (with their new status) and the refusals; refused jobs are untouched.
    """
    now = timezone.now()
    by_id = {c.job_id: c for c in changes}
    changed: list[Job] = []
    refused: list[TransitionRefused] = []
    with transaction.atomic():
        locked = Job.objects.select_for_update().filter(pk__in=by_id).order_by("pk")
        for job in locked.only("id", "status", "team_id"):
            if expected is not None and job.status not in expected:
                refused.append(TransitionRefused(job.pk, job.status, target, _expected(expected)))
            elif not is_allowed(job.status, target):
                refused.append(TransitionRefused(job.pk, job.status, target))
            else:
                changed.append(job)
        _write(target, changed, by_id, actor, now)
    return changed, refused


def transition(
    job_id: int,
    target: JobStatus,
    *,
    reason: str = "",
    actor: str,
    expected: Collection[str] | None = None,
    attempt: int | None = None,
    data: dict | None = None,
) -> Job:
    change = Change(job_id, reason, attempt, data or {})
    changed, refused = apply_transitions(target, [change], actor=actor, expected=expected)
    if refused:
        raise refused[0]
    if not changed:
        raise Job.DoesNotExist(f"job {job_id} does not exist")
    return changed[0]


class Moved(Exception):
    """A job of a group is not where the caller read it (`walk`): the caller rolls back."""


def advance(
    job: Job, path: Sequence[JobStatus], reason: str, *, actor: str, attempt: int | None
) -> None:
    """Walk the job along `path`, skipping the states it has already passed; `job.status` is
    where the caller read it, and is read again after a step."""
    steps = _ahead(JobStatus(job.status), path)
    for target in steps:
        transition(job.pk, target, reason=reason, actor=actor, attempt=attempt)
    if steps:  # a steady tick over a waiting job costs no query here
        job.refresh_from_db(fields=["status"])


def walk(
    attempts: Sequence[Attempt], path: Sequence[JobStatus], reason: str, *, actor: str
) -> None:
    """`advance` for each attempt's job: along `path` from where the caller read it, one
    `apply_transitions` per step and source state for the whole group; `Moved` when a job is
    not where it was read."""
    at = {attempt.job_id: JobStatus(attempt.job.status) for attempt in attempts}
    for target in path:
        movers = [a for a in attempts if target in _ahead(at[a.job_id], path)]
        for source in {at[a.job_id] for a in movers}:
            changes = [
                Change(a.job_id, reason, attempt=a.number) for a in movers if at[a.job_id] == source
            ]
            changed, refused = apply_transitions(target, changes, actor=actor, expected={source})
            if refused or len(changed) != len(changes):
                raise Moved(str(refused[0]) if refused else "a job is gone")
        for attempt in movers:
            at[attempt.job_id] = target


def _ahead(status: JobStatus, path: Sequence[JobStatus]) -> Sequence[JobStatus]:
    """The steps of `path` a job at `status` has still to take."""
    return path[path.index(status) + 1 if status in path else 0 :]


def _write(target: JobStatus, jobs: list[Job], by_id: dict[int, Change], actor: str, now) -> None:
    events = []
    pushed = []
    ids_by_reason: dict[str, list[int]] = defaultdict(list)
    for job in jobs:
        change = by_id[job.pk]
        ids_by_reason[change.reason].append(job.pk)
        events.append(
            JobEvent(
                job_id=job.pk,
                time=now,
                kind=JobEvent.Kind.STATUS,
                from_status=job.status,
                to_status=target,
                reason=change.reason,
                actor=actor,
                attempt=change.attempt,
                data=change.data,
            )
        )
        pushed.append(
            broadcast.status_message(job.pk, job.team_id, job.status, target, change.reason, now)
        )
        job.status = target
        job.status_reason = change.reason
        job.status_changed_at = now
    for reason, ids in ids_by_reason.items():
        Job.objects.filter(pk__in=ids).update(
            status=target, status_reason=reason, status_changed_at=now
        )
    JobEvent.objects.bulk_create(events, batch_size=1000)
    outbox.on_transitions(target, jobs, now)
    broadcast.publish_statuses(pushed)


def _expected(expected: Collection[str]) -> str:
    return "this action needs the job to be " + " or ".join(sorted(expected))
