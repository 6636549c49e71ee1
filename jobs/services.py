"""Actions on jobs: submit and the control verbs. API, console and CLI all come through here.

Each action validates, writes inside one transaction (status through `jobs.transitions`), and
talks to executors and Celery only after commit.
"""

import logging
import re
import secrets
import shlex
from functools import partial

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from jobs import clocks, lifecycle, logstore, teams
from jobs.errors import BadRequest, Conflict, Forbidden, NotFound
from jobs.executors import Capacity, executor_for
from jobs.executors.base import GPU_VISIBILITY_VARS
from jobs.launcher import cancel_current
from jobs.models import Attempt, Cluster, Job, JobEvent, Membership, ScheduleWindow, Snapshot, Team
from jobs.schemas import JobIn
from jobs.snapshots import (
    SnapshotRefused,
    owned_snapshot,
    read_project_file,
    release_claim,
    snapshot_path,
)
from jobs.states import JobStatus
from jobs.transitions import TransitionRefused, transition
from metering.records import forget_deleted

log = logging.getLogger(__name__)
S = JobStatus
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def visible_jobs(user: User) -> QuerySet[Job]:
    if user.is_staff:
        return Job.objects.all()
    # A subquery, not a join through team: every relation joined multiplies PostgreSQL's
    # planning, which was most of a job read (8 ms of 9 with eight relations).
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


def submit_job(user: User, data: JobIn) -> Job:
    membership = _resolve_membership(user, data.team)
    team = membership.team
    cluster = _resolve_cluster(team, data.cluster)
    _check_fits(team, cluster, data.gpus)
    _check_priority(user, membership, data.priority)
    _check_env(data.env)
    window = _resolve_window(data.window)
    if data.window_policy == Job.WindowPolicy.PAUSE and not (
        window or team.window_id or cluster.window_id
    ):
        raise BadRequest(
            "--window-policy pause needs a window: pass --window NAME, or use a team or "
            "cluster that has one"
        )
    with transaction.atomic():
        # Locking the snapshot row keeps a concurrent job deletion from removing the blob.
        snapshot = _resolve_snapshot(data.snapshot, team)
        follow_ons = _follow_on_specs(team, cluster, data.then, snapshot)
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
            window_policy=data.window_policy,
            pending_deadline_s=data.pending_deadline_s,
            max_retries=_or(data.max_retries, team.default_max_retries),
            retry_cooldown_s=_or(data.retry_cooldown_s, team.default_retry_cooldown_s),
            then=list(follow_ons),
            follow_on_specs=follow_ons,
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


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def stop_job(user: User, job_id: int) -> Job:
    return _halt(user, job_id, S.STOPPED, f"stopped by {user.username}")


def pause_job(user: User, job_id: int) -> Job:
    return _halt(user, job_id, S.PAUSED, f"paused by {user.username}")


def resume_job(user: User, job_id: int) -> Job:
    job = _controllable(user, job_id)
    with transaction.atomic():
        transition(
            job.pk,
            S.QUEUED,
            reason=f"resumed by {user.username}; waiting for the scheduler",
            actor=user.username,
            expected={S.PAUSED},
        )
        Job.objects.filter(pk=job.pk).update(paused_by_window=False)
    transaction.on_commit(kick_scheduler)
    return get_visible_job(user, job_id)


def retry_job(user: User, job_id: int) -> Job:
    job = _controllable(user, job_id)
    why_not = retry_unavailable_reason(job)
    if why_not and job.status in (S.FAILED, S.STOPPED):  # other states: the table refuses
        raise Conflict(
            f"job {job_id} is {job.status}: it cannot be retried: {why_not}", status=job.status
        )
    with transaction.atomic():
        transition(
            job.pk,
            S.QUEUED,
            reason=f"retried by {user.username}; waiting for the scheduler",
            actor=user.username,
            expected={S.FAILED, S.STOPPED},
        )
        Job.objects.filter(pk=job.pk).update(retry_count=F("retry_count") + 1, next_attempt_at=None)
    transaction.on_commit(kick_scheduler)
    return get_visible_job(user, job_id)


def retry_unavailable_reason(job: Job) -> str:
    """Why `retry` would be refused right now, or "" when it would be accepted."""
    if job.status not in (S.FAILED, S.STOPPED):
        return f"only FAILED or STOPPED jobs can be retried; this one is {job.status}"
    snapshot = job.snapshot
    if snapshot is None or snapshot_path(snapshot.sha256).exists():
        return ""
    how = snapshot.deleted_reason or "outside Starforge (the file is missing)"
    return f"the working-directory snapshot was deleted {how}; submit again"


def delete_job(user: User, job_id: int) -> None:
    """Delete a finished job's row, timeline and logs; its snapshot goes with its last job."""
    job = _controllable(user, job_id)
    if job.status in S.active() or job.status == S.QUEUED:
        raise Conflict(
            f"job {job_id} is {job.status}: stop it before deleting it", status=job.status
        )
    with transaction.atomic():
        snapshot = _lock_snapshot(job.snapshot_id)
        forget_deleted(job.pk)  # its GPU time stays billed in the usage records
        job.delete()
        transaction.on_commit(partial(logstore.delete_logs, job_id))
        if snapshot is not None:
            # The team's claim goes with its last job using it; the blob with the last claim.
            release_claim(job.team_id, snapshot)


def _halt(user: User, job_id: int, target: JobStatus, reason: str) -> Job:
    _controllable(user, job_id)
    with transaction.atomic():
        # Read the row under its lock: a scheduler tick may have admitted the job (a new open
        # attempt) since the check above, and that attempt is the one to close.
        job = Job.objects.select_for_update().get(pk=job_id)
        changed = transition(
            job.pk, target, reason=reason, actor=user.username, attempt=job.attempt_count or None
        )
        # A stop also cancels a pending automatic retry; a person's pause or stop is theirs,
        # so a reopening window does not resume it.
        Job.objects.filter(pk=job.pk).update(next_attempt_at=None, paused_by_window=False)
        had_attempt = clocks.close_open(
            Attempt.objects.filter(job_id=job.pk, number=job.attempt_count).values_list(
                "pk", flat=True
            ),
            timezone.now(),
            reason,
        )
        # A FAILED job already said its follow-ons were not created, unless it was waiting
        # for an automatic retry (which could still have succeeded): then the stop decides.
        if target == S.STOPPED and (job.status != S.FAILED or job.next_attempt_at is not None):
            lifecycle.not_succeeded(job, S.STOPPED)
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
    if not teams.can_control_jobs(user, job.team_id):
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


def _resolve_membership(user: User, name: str | None) -> Membership:
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
    return membership


def _check_priority(user: User, membership: Membership, priority: int) -> None:
    """Members raise priority up to the team's limit; team admins and staff up to 100."""
    if user.is_staff or membership.role == Membership.Role.ADMIN:
        return
    limit = membership.team.max_member_priority
    if priority > limit:
        raise Forbidden(
            f"priority {priority} is above {limit}, the highest a member of team "
            f"{membership.team.name} may give; ask a team admin to raise it"
        )


def _resolve_cluster(team: Team, name: str | None) -> Cluster:
    if name:
        cluster = teams.named(Cluster, name, "cluster", "clusters")
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
    if team.max_gpus_per_job is not None and gpus > team.max_gpus_per_job:
        raise BadRequest(
            f"this job asks for {gpus} GPUs but team {team.name} allows at most "
            f"{team.max_gpus_per_job} per job"
        )
    if team.user_gpu_cap is not None and gpus > team.user_gpu_cap:
        raise BadRequest(
            f"this job asks for {gpus} GPUs but team {team.name} caps each member at "
            f"{team.user_gpu_cap} GPUs at once; it could never start"
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
        if key.startswith("SF_"):
            raise BadRequest(
                f"environment variable {key} is set by Starforge and cannot be overridden"
            )
        if key in GPU_VISIBILITY_VARS:
            raise BadRequest(
                f"environment variable {key} chooses which GPUs a job sees; Starforge sets it "
                "from the GPUs it allocates (ask for them with --gpus)"
            )


def _resolve_snapshot(sha: str | None, team: Team) -> Snapshot | None:
    """The team's own snapshot, locked; another team's is refused exactly like an unknown one."""
    if sha is None:
        return None
    snapshot = owned_snapshot(team, sha)
    if snapshot is None:
        raise NotFound(
            f"snapshot {sha[:64]!r} is unknown to team {team.name}; upload it to "
            f"/api/v1/snapshots?team={team.name} first"
        )
    return snapshot


def _lock_snapshot(sha: str | None) -> Snapshot | None:
    if sha is None:
        return None
    return Snapshot.objects.select_for_update().filter(pk=sha).first()


def _follow_on_specs(
    team: Team, cluster: Cluster, names: list[str], snapshot: Snapshot | None
) -> dict:
    if not names:
        return {}
    if snapshot is None:
        raise BadRequest("--then needs a snapshot holding starforge.toml with [then.<name>]")
    try:
        project = read_project_file(snapshot_path(snapshot.sha256))
    except SnapshotRefused as exc:
        raise BadRequest(str(exc)) from exc
    capacity = executor_for(cluster).capacity()
    specs = {}
    for name in names:
        spec = project.get("then", {}).get(name)
        if not isinstance(spec, dict):
            raise BadRequest(
                f"--then {name} needs a [then.{name}] table in starforge.toml at "
                "the root of the submitted directory"
            )
        specs[name] = _check_follow_on(team, cluster, capacity, name, spec)
    return specs


def _check_follow_on(
    team: Team, cluster: Cluster, capacity: Capacity, name: str, spec: dict
) -> dict:
    entrypoint = spec.get("entrypoint")
    argv = _follow_on_argv(entrypoint)
    if argv is None:
        raise BadRequest(
            f"[then.{name}] in starforge.toml needs an entrypoint: a command string "
            "or a list of non-empty strings, without NUL characters and with balanced quotes"
        )
    gpus = spec.get("gpus", 0)
    if type(gpus) is not int or not 0 <= gpus <= team.gpu_quota:
        raise BadRequest(
            f"[then.{name}] gpus must be an integer from 0 to team "
            f"{team.name}'s quota of {team.gpu_quota}"
        )
    if capacity.reachable and gpus > capacity.total_gpus:
        raise BadRequest(
            f"[then.{name}] asks for {gpus} GPUs but cluster {cluster.name} has "
            f"{capacity.total_gpus}; it could never start"
        )
    return {"entrypoint": argv, "gpus": gpus}


def _follow_on_argv(entrypoint: object) -> list[str] | None:
    """The argv a follow-on's entrypoint becomes; None if unusable.

    Split and checked at submit, so creating the follow-on inside the reconciler's transaction
    that ends the parent cannot fail on it.
    """
    if isinstance(entrypoint, str):
        try:
            argv = shlex.split(entrypoint)
        except ValueError:
            return None
    elif isinstance(entrypoint, list) and all(isinstance(a, str) for a in entrypoint):
        argv = entrypoint
    else:
        return None
    if not argv or any(not a or "\x00" in a for a in argv):
        return None
    return argv


def _resolve_window(name: str | None) -> ScheduleWindow | None:
    if name is None:
        return None
    return teams.named(ScheduleWindow, name, "schedule window", "windows")


__all__ = [
    "TransitionRefused",
    "delete_job",
    "get_visible_job",
    "pause_job",
    "resume_job",
    "retry_job",
    "stop_job",
    "submit_job",
    "visible_jobs",
]
