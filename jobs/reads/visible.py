"""Reading jobs as a user may: which jobs they see, one job with what its pages need, and the
facts a read shows (the current attempt, why a retry would be refused). Nothing here writes.
"""

from django.contrib.auth.models import User
from django.db.models import QuerySet

from jobs.errors import NotFound
from jobs.models import Attempt, Job, Membership
from jobs.states import JobStatus
from jobs.stores.snapshots import snapshot_stored

S = JobStatus


def visible_jobs(user: User) -> QuerySet[Job]:
    """Every job of the user's teams (staff: every job)."""
    if user.is_staff:
        return Job.objects.all()
    # A subquery, not a join through team: every relation joined multiplies the time
    # PostgreSQL spends planning, which dominates a read this small.
    return Job.objects.filter(team_id__in=Membership.objects.filter(user=user).values("team_id"))


def with_related(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """What `job_out` and the pages read: team, user and cluster joined; the window and the
    attempts in one small query each, which plans far faster than joins."""
    return jobs.select_related("team", "user", "cluster").prefetch_related("window", "attempts")


def current_attempt(job: Job) -> Attempt | None:
    """The job's current attempt, taken from its attempts (prefetched by `with_related`)."""
    if job.current_attempt_id is None:
        return None
    return next((a for a in job.attempts.all() if a.pk == job.current_attempt_id), None)


def get_visible_job(user: User, job_id: int) -> Job:
    job = with_related(visible_jobs(user)).filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"job {job_id} does not exist or belongs to a team you are not in")
    return job


def retry_unavailable_reason(job: Job) -> str:
    """Why `retry` would be refused right now, or "" when it would be accepted."""
    snapshot = job.snapshot if job.status in (S.FAILED, S.STOPPED) else None
    return retry_refusal(
        job.status,
        snapshot.sha256 if snapshot else None,
        snapshot.deleted_reason if snapshot else "",
    )


def retry_refusal(status: str, snapshot: str | None, deleted_reason: str) -> str:
    """`retry_unavailable_reason` from a job's columns: its status, the sha256 of its snapshot
    (None: none) and the snapshot's `deleted_reason`."""
    if status not in (S.FAILED, S.STOPPED):
        return f"only FAILED or STOPPED jobs can be retried; this one is {status}"
    if snapshot is None or snapshot_stored(snapshot):
        return ""
    how = deleted_reason or "outside Starforge (the file is missing)"
    return f"the working-directory snapshot was deleted {how}; submit again"
