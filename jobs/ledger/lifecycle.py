"""What happens after an attempt ends: automatic retries, follow-on jobs, and their notes.

Called by `jobs.ledger.ends` inside the transaction that closes the attempt and moves the job,
so each decision is taken exactly once however many times the end is observed; and, for the
cooled-down retries, by the scheduler's tick (`requeue_due_retries`).
"""

import datetime as dt

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from sf.contract import Failure

from jobs import grants
from jobs.ledger import creation
from jobs.ledger.transitions import Change, apply_transitions
from jobs.models import Job, JobEvent
from jobs.states import JobStatus


def cooldown_s(job: Job) -> int:
    """Seconds before the next automatic attempt: doubles with each retry, up to a cap."""
    return min(settings.SF_RETRY_COOLDOWN_CAP_S, job.retry_cooldown_s * 2**job.retry_count)


def after_failure(job_id: int, failure: str, now: dt.datetime) -> None:
    job = Job.objects.select_for_update().get(pk=job_id)
    if failure in Failure.retryable() and job.retry_count < job.max_retries:
        delay = cooldown_s(job)
        at = now + dt.timedelta(seconds=delay)
        number = job.retry_count + 1
        plan = f"automatic retry {number} of {job.max_retries} at {at:%H:%M:%S} UTC"
        Job.objects.filter(pk=job_id).update(
            next_attempt_at=at, status_reason=f"{job.status_reason}\n{plan}"
        )
        _note(job_id, f"{plan} (cooldown {delay} s)", retry_at=at.isoformat())
        return
    if job.max_retries:
        why = (
            f"{failure or 'this'} failures are not retried automatically"
            if failure not in Failure.retryable()
            else f"the retry budget of {job.max_retries} is used"
        )
        _note(job_id, f"no automatic retry: {why}")
    not_succeeded(job, "FAILED")


def not_succeeded(job: Job, status: str) -> None:
    if job.then:
        _note(
            job.pk,
            f"follow-on jobs {', '.join(job.then)} were not created: the job ended "
            f"{status}, not SUCCEEDED",
        )


def requeue_due_retries(now: dt.datetime | None = None) -> list[int]:
    """FAILED jobs whose cooldown has passed go back on the queue (retry count + 1)."""
    now = now or timezone.now()
    due = list(
        Job.objects.filter(status=JobStatus.FAILED, next_attempt_at__lte=now).values_list(
            "pk", flat=True
        )
    )
    if not due:
        return []
    with transaction.atomic():
        changed, _ = apply_transitions(
            JobStatus.QUEUED,
            [Change(pk, "automatic retry; waiting for the scheduler") for pk in due],
            actor="auto-retry",
            expected={JobStatus.FAILED},
        )
        ids = [job.pk for job in changed]
        Job.objects.filter(pk__in=ids).update(
            retry_count=F("retry_count") + 1, next_attempt_at=None
        )
    return ids


def after_success(job_id: int) -> list[Job]:
    """Create the job's follow-on jobs, once each (a unique constraint backs the check), on
    its cluster while its team may still use it (`jobs.grants`)."""
    parent = Job.objects.select_for_update().get(pk=job_id)
    if parent.then and not grants.may_use(parent.team_id, parent.cluster_id):
        _note(
            parent.pk,
            f"follow-on jobs {', '.join(parent.then)} were not created: team "
            f"{parent.team.name} may no longer use cluster {parent.cluster.name}",
        )
        return []
    there = set(Job.objects.filter(parent=parent).values_list("follow_on_name", flat=True))
    made = [
        creation.follow_on(parent, name, parent.follow_on_specs[name])
        for name in parent.then
        if name not in there
    ]
    if made:
        creation.queue(
            made,
            lambda child: f"follow-on {child.follow_on_name} of job {parent.pk}",
            actor="follow-on",
        )
    for child in made:
        note = f"follow-on {child.follow_on_name} created as job {child.pk}"
        _note(parent.pk, note, job=child.pk)
    return made


def _note(job_id: int, reason: str, **data) -> None:
    JobEvent.objects.create(
        job_id=job_id, kind=JobEvent.Kind.NOTE, actor="lifecycle", reason=reason, data=data
    )
