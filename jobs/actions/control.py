"""The control verbs a person uses on a job: stop, pause, resume, retry and delete.

API, console and CLI all come through here. Which verb is allowed from which state is
`jobs.states.VERBS`; each verb checks who may act, writes inside one transaction (status
through `jobs.ledger.transitions`, stop and pause through `jobs.ledger.halt`), and talks to
executors and Celery only after commit.
"""

import logging
from functools import partial

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs import grants, kick
from jobs.errors import Conflict, Forbidden
from jobs.ledger import halt
from jobs.ledger.transitions import transition
from jobs.models import Job, Snapshot
from jobs.reads import teams
from jobs.reads.visible import get_visible_job, retry_unavailable_reason
from jobs.states import VERBS, JobStatus
from jobs.stores import logstore
from jobs.stores.metrics import ingest
from jobs.stores.snapshots import release_claim
from metering.records import forget_deleted

log = logging.getLogger(__name__)
S = JobStatus


def stop_job(user: User, job_id: int) -> Job:
    return _halt(user, job_id, S.STOPPED, f"stopped by {user.username}")


def pause_job(user: User, job_id: int) -> Job:
    return _halt(user, job_id, S.PAUSED, f"paused by {user.username}")


def _halt(user: User, job_id: int, target: JobStatus, reason: str) -> Job:
    _controllable(user, job_id)
    done = halt.halt([job_id], target, reason, actor=user.username, now=timezone.now())
    if done.refused:
        raise done.refused[0]
    return get_visible_job(user, job_id)


def resume_job(user: User, job_id: int) -> Job:
    job = _controllable(user, job_id)
    _requeue(user, job, "resume", "resumed", paused_by_window=False)
    return get_visible_job(user, job_id)


def retry_job(user: User, job_id: int) -> Job:
    job = _controllable(user, job_id)
    why_not = retry_unavailable_reason(job)
    retry = VERBS["retry"]
    if why_not and job.status in retry.allowed_from:  # other states: `expected` refuses
        raise Conflict(
            f"job {job_id} is {job.status}: it cannot be retried: {why_not}", status=job.status
        )
    _requeue(user, job, "retry", "retried", retry_count=F("retry_count") + 1, next_attempt_at=None)
    return get_visible_job(user, job_id)


def _requeue(user: User, job: Job, verb: str, done: str, **fields) -> None:
    """Back to QUEUED where `VERBS[verb]` allows it, with `fields` set; a tick after commit.
    Only on a cluster the team may still use: another gets the 404 of an unknown cluster."""
    grants.check_may_use(job.team, job.cluster)
    with transaction.atomic():
        transition(
            job.pk,
            S.QUEUED,
            reason=f"{done} by {user.username}; waiting for the scheduler",
            actor=user.username,
            expected=VERBS[verb].allowed_from,
        )
        Job.objects.filter(pk=job.pk).update(**fields)
    transaction.on_commit(kick.scheduler)


def delete_job(user: User, job_id: int) -> None:
    """Delete a finished job's row, timeline and logs; its snapshot goes with its last job."""
    job = _controllable(user, job_id)
    if job.status not in VERBS["delete"].allowed_from:
        raise Conflict(
            f"job {job_id} is {job.status}: stop it before deleting it", status=job.status
        )
    with transaction.atomic():
        snapshot = _lock_snapshot(job.snapshot_id)
        ingest.hold_writers(job.pk)  # before the cascade deletes its metric rollups
        forget_deleted(job.pk)  # its GPU time stays billed in the usage records
        job.delete()
        transaction.on_commit(partial(logstore.delete_logs, job_id))
        if snapshot is not None:
            # The team's claim goes with its last job using it; the blob with the last claim.
            release_claim(job.team_id, snapshot)


def _lock_snapshot(sha: str | None) -> Snapshot | None:
    if sha is None:
        return None
    return Snapshot.objects.select_for_update().filter(pk=sha).first()


def _controllable(user: User, job_id: int) -> Job:
    job = get_visible_job(user, job_id)
    if not teams.can_control_jobs(user, job.team_id):
        raise Forbidden(
            f"you can read job {job_id} but not control it (viewer role in team {job.team.name})"
        )
    return job
