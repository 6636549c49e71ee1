"""Actions on jobs: submit and the control verbs. API, console and CLI all come through here.

Each action validates, writes inside one transaction (status through `jobs.transitions`), and
talks to executors and Celery only after commit.
"""

import logging
import re
import secrets

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from jobs.errors import BadRequest, Conflict, Forbidden, NotFound
from jobs.executors import executor_for
from jobs.launcher import cancel_current
from jobs.models import Attempt, Cluster, Job, JobEvent, Membership, ScheduleWindow, Snapshot, Team
from jobs.schemas import JobIn
from jobs.snapshots import snapshot_path
from jobs.states import JobStatus
from jobs.transitions import TransitionRefused, transition

log = logging.getLogger(__name__)
S = JobStatus
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def visible_jobs(user: User) -> QuerySet[Job]:
    if user.is_staff:
        return Job.objects.all()
    return Job.objects.filter(team__membership__user=user)


def get_visible_job(user: User, job_id: int) -> Job:
    job = (
        visible_jobs(user)
        .select_related("team", "user", "cluster", "current_attempt", "window")
        .filter(pk=job_id)
        .first()
    )
    if job is None:
        raise NotFound(f"job {job_id} does not exist or belongs to a team you are not in")
    return job


def submit_job(user: User, data: JobIn) -> Job:
    team = _resolve_team(user, data.team)
    cluster = _resolve_cluster(team, data.cluster)
    _check_fits(team, cluster, data.gpus)
    _check_env(data.env)
    snapshot = _resolve_snapshot(data.snapshot)
    window = _resolve_window(data.window)
    with transaction.atomic():
        job = Job.objects.create(
            run_id=secrets.token_hex(8),
            name=data.name or " ".join(data.entrypoint)[:200],
            team=team,
            user=user,
            cluster=cluster,
            gpus=data.gpus,
            entrypoint=data.entrypoint,
            env=data.env,
            snapshot=snapshot,
            priority=data.priority,
            window=window,
            pending_deadline_s=data.pending_deadline_s,
            status_reason="waiting for the scheduler's next tick",
        )
        JobEvent.objects.create(
            job=job,
            kind=JobEvent.Kind.STATUS,
            to_status=S.QUEUED,
            reason="submitted",
            actor=user.username,
        )
        transaction.on_commit(kick_scheduler)
    return job


def stop_job(user: User, job_id: int) -> Job:
    return _halt(user, job_id, S.STOPPED, f"stopped by {user.username}")


def pause_job(user: User, job_id: int) -> Job:
    return _halt(user, job_id, S.PAUSED, f"paused by {user.username}")


def resume_job(user: User, job_id: int) -> Job:
    job = _controllable(user, job_id)
    transition(
        job.pk,
        S.QUEUED,
        reason=f"resumed by {user.username}; waiting for the scheduler",
        actor=user.username,
        expected={S.PAUSED},
    )
    transaction.on_commit(kick_scheduler)
    return get_visible_job(user, job_id)


def retry_job(user: User, job_id: int) -> Job:
    job = _controllable(user, job_id)
    if (
        job.status in (S.FAILED, S.STOPPED)
        and job.snapshot_id
        and not snapshot_path(job.snapshot_id).exists()
    ):
        raise Conflict(
            f"job {job_id} cannot be retried: the working-directory snapshot was "
            "deleted; submit again"
        )
    with transaction.atomic():
        transition(
            job.pk,
            S.QUEUED,
            reason=f"retried by {user.username}; waiting for the scheduler",
            actor=user.username,
            expected={S.FAILED, S.STOPPED},
        )
        Job.objects.filter(pk=job.pk).update(retry_count=F("retry_count") + 1)
    transaction.on_commit(kick_scheduler)
    return get_visible_job(user, job_id)


def _halt(user: User, job_id: int, target: JobStatus, reason: str) -> Job:
    job = _controllable(user, job_id)
    with transaction.atomic():
        changed = transition(
            job.pk, target, reason=reason, actor=user.username, attempt=job.attempt_count or None
        )
        had_attempt = Attempt.objects.filter(
            pk=job.current_attempt_id, end_time__isnull=True
        ).update(end_time=timezone.now(), end_reason=reason)
    if had_attempt and changed.status == target:
        _cancel_after_commit(job.pk)
    return get_visible_job(user, job_id)


def _cancel_after_commit(job_id: int) -> None:
    def cancel() -> None:
        try:
            cancel_current(job_id)
        except Exception:  # the reconciler's orphan sweep cancels it again on its next tick
            log.exception("cancel of job %s failed; the reconciler will retry", job_id)

    transaction.on_commit(cancel)


def _controllable(user: User, job_id: int) -> Job:
    job = get_visible_job(user, job_id)
    if (
        not user.is_staff
        and not Membership.objects.filter(
            team=job.team, user=user, role__in=["member", "admin"]
        ).exists()
    ):
        raise Forbidden(
            f"you can read job {job_id} but not control it (viewer role in team {job.team.name})"
        )
    return job


def kick_scheduler() -> None:
    """Run a scheduler tick soon, without waiting for beat; best effort."""
    from jobs.tasks import schedule_tick

    try:
        schedule_tick.apply_async(retry=False)
    except Exception as exc:
        log.warning("could not kick the scheduler (%s); beat's next tick will admit the job", exc)


def _resolve_team(user: User, name: str | None) -> Team:
    memberships = Membership.objects.filter(user=user).select_related("team").order_by("pk")
    if name:
        membership = memberships.filter(team__name=name).first()
        if membership is None:
            raise Forbidden(f"you are not a member of team {name!r}")
    else:
        membership = memberships.first()
        if membership is None:
            raise Forbidden("you belong to no team; ask an admin to add you to one")
    if membership.role == Membership.Role.VIEWER:
        raise Forbidden(
            f"your role in team {membership.team.name} is viewer; viewers cannot submit jobs"
        )
    return membership.team


def _resolve_cluster(team: Team, name: str | None) -> Cluster:
    if name:
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
            raise BadRequest(f"unknown cluster {name!r}; known clusters: {known}")
    else:
        cluster = team.default_cluster or Cluster.objects.filter(name="local").first()
        if cluster is None:
            raise BadRequest(f"team {team.name} has no default cluster; pass --cluster")
    if not cluster.enabled:
        raise BadRequest(f"cluster {cluster.name} is disabled")
    return cluster


def _check_fits(team: Team, cluster: Cluster, gpus: int) -> None:
    if gpus > team.gpu_quota:
        raise BadRequest(
            f"this job asks for {gpus} GPUs but team {team.name}'s quota is "
            f"{team.gpu_quota}; it could never start"
        )
    capacity = executor_for(cluster).capacity()
    if capacity.reachable and gpus > capacity.total_gpus:
        raise BadRequest(
            f"this job asks for {gpus} GPUs but cluster {cluster.name} has "
            f"{capacity.total_gpus}; it could never start"
        )


def _check_env(env: dict[str, str]) -> None:
    for key in env:
        if not ENV_NAME.fullmatch(key):
            raise BadRequest(f"environment variable name {key!r} is not valid")
        if key.startswith("SF_") or key == "CUDA_VISIBLE_DEVICES":
            raise BadRequest(
                f"environment variable {key} is set by Starforge and cannot be overridden"
            )


def _resolve_snapshot(sha: str | None) -> Snapshot | None:
    if sha is None:
        return None
    snapshot = Snapshot.objects.filter(pk=sha).first()
    if snapshot is None or not snapshot_path(sha).exists():
        raise BadRequest(f"snapshot {sha[:64]!r} is unknown; upload it to /api/v1/snapshots first")
    return snapshot


def _resolve_window(name: str | None) -> ScheduleWindow | None:
    if name is None:
        return None
    window = ScheduleWindow.objects.filter(name=name).first()
    if window is None:
        raise BadRequest(f"unknown schedule window {name!r}")
    return window


__all__ = [
    "TransitionRefused",
    "get_visible_job",
    "pause_job",
    "resume_job",
    "retry_job",
    "stop_job",
    "submit_job",
    "visible_jobs",
]
