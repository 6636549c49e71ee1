"""A team's idle and hang policy set, and a job exempted from the idle policy: by the team's
admins and staff only (a member gets 403, so a member cannot lift the policy that watches
their own jobs). The API, the CLI (`sf team set NAME idle_after=30m ...`) and the admin's
form end here or in the same model; the watch reads the row (`jobs.loops.activity`).
"""

import datetime as dt
import logging
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from jobs.errors import BadRequest, Forbidden
from jobs.models import ActivityPolicy, IdleExemption, Job, JobEvent
from jobs.reads.teams import can_manage, get_team
from jobs.reads.visible import get_visible_job
from jobs.schemas import text_fault

log = logging.getLogger(__name__)
SECONDS_FIELDS = ("idle_after_s", "idle_grace_s", "hang_after_s")
CHOICES = {
    "idle_action": tuple(ActivityPolicy.IdleAction.values),
    "hang_action": tuple(ActivityPolicy.HangAction.values),
}
POLICY_FIELDS = SECONDS_FIELDS + tuple(CHOICES)
MAX_S = 30 * 24 * 3600
NULLABLE = ("idle_after_s", "hang_after_s")  # None: that policy is off


def policy_of(team_id: int) -> dict[str, Any]:
    """The team's policy as the API answers it (the defaults where none was set)."""
    row = ActivityPolicy.objects.filter(team_id=team_id).first() or ActivityPolicy()
    return {name: getattr(row, name) for name in POLICY_FIELDS}


def set_policy(actor: User, team_name: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Set the named fields of the team's policy; 403 for anyone but its admins and staff."""
    team = get_team(actor, team_name)
    if not can_manage(actor, team):
        raise Forbidden(f"only team admins of team {team.name} can set its idle and hang policy")
    values = checked_policy(changes)
    with transaction.atomic():
        ActivityPolicy.objects.update_or_create(team=team, defaults=values)
    log.info("team %s activity policy set by %s: %s", team.name, actor.username, values)
    return policy_of(team.pk)


def checked_policy(changes: dict[str, Any]) -> dict[str, Any]:
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        raise BadRequest(
            f"the activity policy has only {', '.join(POLICY_FIELDS)} "
            f"(got {', '.join(sorted(unknown))})"
        )
    values: dict[str, Any] = {}
    for name, value in changes.items():
        if name in CHOICES:
            if value not in CHOICES[name]:
                raise BadRequest(f"{name} must be one of {', '.join(CHOICES[name])}")
        elif value is None and name in NULLABLE:
            pass
        elif type(value) is not int or not 1 <= value <= MAX_S:
            raise BadRequest(f"{name} must be a whole number of seconds from 1 to {MAX_S}")
        values[name] = value
    return values


def exempt(actor: User, job_id: int, reason: str, now: dt.datetime) -> IdleExemption:
    """Exempt a job from its team's idle policy (its team's admins and staff only)."""
    job = _managed_job(actor, job_id)
    if fault := text_fault(reason):
        raise BadRequest(f"the reason {fault}")
    with transaction.atomic():
        exemption, _ = IdleExemption.objects.update_or_create(
            job=job, defaults={"by": actor, "at": now, "reason": reason[:200]}
        )
        _note(job, f"exempted from the idle policy by {actor.username}", actor, now)
    return exemption


def lift_exemption(actor: User, job_id: int, now: dt.datetime) -> None:
    job = _managed_job(actor, job_id)
    with transaction.atomic():
        if IdleExemption.objects.filter(job=job).delete()[0]:
            _note(job, f"idle policy applies again ({actor.username})", actor, now)


def _managed_job(actor: User, job_id: int) -> Job:
    job = get_visible_job(actor, job_id)
    if not can_manage(actor, get_team(actor, job.team.name)):
        raise Forbidden(
            f"only team admins of team {job.team.name} can exempt a job from its idle policy"
        )
    return job


def _note(job: Job, reason: str, actor: User, now: dt.datetime) -> None:
    JobEvent.objects.create(
        job=job, time=now, kind=JobEvent.Kind.NOTE, reason=reason, actor=actor.username
    )
