"""Teams and their members: who may read a team, and what a team admin may change.

Every member reads their teams (members, quotas, defaults). A team admin, or staff, adds and
removes members, changes roles and sets the team's defaults. Quotas are staff's alone, through
the Django admin. API and console both come through here.

Each change locks the team row first, so two admins demoting each other at once cannot leave
a team without an admin. Live pages a change concerns are told after commit (`jobs.broadcast`), so
a removed member's open websockets stop at once rather than at their next reconnect. Their
waiting work in the team stops in the same transaction, whatever removed them
(`jobs.signals`, `jobs.ledger.departures`); `inherited_jobs` lists what still runs.
"""

import logging
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Prefetch, QuerySet

from jobs import broadcast, grants
from jobs.errors import BadRequest, Conflict, Forbidden, NotFound
from jobs.models import TIME_LIMIT_MAX_S, Cluster, ClusterGrant, Membership, ScheduleWindow, Team
from jobs.reads import outsiders
from jobs.schemas import text_fault

log = logging.getLogger(__name__)
ROLES = tuple(Membership.Role.values)
MAX_RETRIES_LIMIT = 100
RETRY_COOLDOWN_LIMIT_S = 24 * 3600
DEFAULT_FIELDS = (
    "default_cluster",
    "window",
    "default_max_retries",
    "default_retry_cooldown_s",
    "default_time_limit_s",
)


def visible_teams(user: User) -> QuerySet[Team]:
    """The teams the user is in (every team for staff), members and the clusters each may use
    (`grants`) prefetched, by name."""
    teams = Team.objects.all() if user.is_staff else Team.objects.filter(membership__user=user)
    members = Membership.objects.select_related("user").order_by("user__username")
    granted = ClusterGrant.objects.select_related("cluster").order_by("cluster__name")
    return (
        teams.select_related("default_cluster", "window")
        .prefetch_related(
            Prefetch("membership_set", queryset=members, to_attr="memberships"),
            Prefetch("cluster_grants", queryset=granted, to_attr="grants"),
        )
        .order_by("name")
    )


def get_team(user: User, name: str) -> Team:
    team = visible_teams(user).filter(name=name).first()
    if team is None:
        raise NotFound(f"team {name} does not exist or you are not in it")
    return team


def role_of(user: User, team: Team) -> str | None:
    """The user's role in a team read through `visible_teams` (None: staff outside it)."""
    return next((m.role for m in team.memberships if m.user_id == user.pk), None)  # type: ignore[attr-defined]


def cluster_names(team: Team) -> list[str]:
    """The clusters a team read through `visible_teams` may use, by name."""
    return [grant.cluster.name for grant in team.grants]  # type: ignore[attr-defined]


def can_manage(user: User, team: Team) -> bool:
    return user.is_staff or role_of(user, team) == Membership.Role.ADMIN


def can_control_jobs(user: User, team_id: int) -> bool:
    """Members and team admins submit and control the team's jobs (staff: every job)."""
    return (
        user.is_staff
        or Membership.objects.filter(
            team_id=team_id, user=user, role__in=[Membership.Role.MEMBER, Membership.Role.ADMIN]
        ).exists()
    )


def inherited_jobs(actor: User, team_name: str) -> list[outsiders.Outsider]:
    """The team's running jobs whose submitter may no longer submit in it (removed, made a
    viewer, deactivated): the team's work now, listed for its admins to keep or stop."""
    team = get_team(actor, team_name)
    if not can_manage(actor, team):
        raise Forbidden(
            f"only team admins of team {team_name} see the running jobs of members who left"
        )
    return outsiders.inherited(team)


def uploading_team(user: User, name: str | None) -> Team:
    """The team a snapshot upload is for: the named one, or the user's only team they can
    upload to. Members and team admins upload; viewers and outsiders (staff too) do not."""
    memberships = list(
        Membership.objects.filter(user=user).select_related("team").order_by("team__name")
    )
    if name:
        membership = next((m for m in memberships if m.team.name == name), None)
        if membership is None:
            raise Forbidden(f"you are not a member of team {name!r}; upload for one of your teams")
        if membership.role == Membership.Role.VIEWER:
            raise Forbidden(f"your role in team {name} is viewer; viewers cannot upload snapshots")
        return membership.team
    able = [m.team for m in memberships if m.role != Membership.Role.VIEWER]
    if len(able) == 1:
        return able[0]
    if not able:
        if memberships:
            raise Forbidden(
                "you are a viewer in every team of yours; viewers cannot upload snapshots"
            )
        raise Forbidden("you belong to no team; ask an admin to add you to one")
    names = ", ".join(t.name for t in able)
    raise BadRequest(
        f"say which team the snapshot is for with ?team=NAME (sf submit --team); yours: {names}"
    )


def add_member(actor: User, team_name: str, username: str, role: str) -> Membership:
    with transaction.atomic():
        team = _managed_team(actor, team_name)
        _check_role(role)
        user = User.objects.filter(username=_text("a user name", username)).first()
        if user is None:
            raise BadRequest(f"unknown user {username!r}; staff create users in the admin")
        existing = Membership.objects.filter(team=team, user=user).first()
        if existing is not None:
            raise Conflict(
                f"{username} is already in team {team.name} as {existing.role}; "
                "change their role instead"
            )
        membership = Membership.objects.create(team=team, user=user, role=role)
        _membership_changed(actor, team, user, f"added as {role}")
    return membership


def change_role(actor: User, team_name: str, username: str, role: str) -> Membership:
    with transaction.atomic():
        team = _managed_team(actor, team_name)
        _check_role(role)
        membership = _membership(team, username)
        if membership.role == Membership.Role.ADMIN and role != Membership.Role.ADMIN:
            _keep_an_admin(team, username, f"make them {role}")
        Membership.objects.filter(pk=membership.pk).update(role=role)
        membership.role = role
        _membership_changed(actor, team, membership.user, f"role set to {role}")
    return membership


def remove_member(actor: User, team_name: str, username: str) -> None:
    with transaction.atomic():
        team = _managed_team(actor, team_name)
        membership = _membership(team, username)
        if membership.role == Membership.Role.ADMIN:
            _keep_an_admin(team, username, "remove them")
        membership.delete()
        _membership_changed(actor, team, membership.user, "removed")


def set_defaults(actor: User, team_name: str, changes: dict[str, Any]) -> Team:
    """Set the team's defaults named in `changes` (cluster and window by name, None clears)."""
    with transaction.atomic():
        team = _managed_team(actor, team_name)
        unknown = set(changes) - set(DEFAULT_FIELDS)
        if unknown:
            raise BadRequest(
                f"a team admin sets only {', '.join(DEFAULT_FIELDS)}; quotas are set by staff "
                f"in the admin (got {', '.join(sorted(unknown))})"
            )
        values = _resolve_defaults(actor, team, changes)
        Team.objects.filter(pk=team.pk).update(**values)
        log.info("team %s defaults set by %s: %s", team.name, actor.username, changes)
    return get_team(actor, team_name)


def _resolve_defaults(actor: User, team: Team, changes: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "default_cluster" in changes:
        values["default_cluster"] = _cluster(actor, team, changes["default_cluster"])
    if "window" in changes:
        values["window"] = _window(changes["window"])
    if "default_max_retries" in changes:
        values["default_max_retries"] = _in_range(
            "default_max_retries", changes["default_max_retries"], MAX_RETRIES_LIMIT
        )
    if "default_retry_cooldown_s" in changes:
        values["default_retry_cooldown_s"] = _in_range(
            "default_retry_cooldown_s", changes["default_retry_cooldown_s"], RETRY_COOLDOWN_LIMIT_S
        )
    if "default_time_limit_s" in changes:  # None clears it: no limit
        limit = changes["default_time_limit_s"]
        values["default_time_limit_s"] = (
            None if limit is None else _in_range("default_time_limit_s", limit, TIME_LIMIT_MAX_S, 1)
        )
    return values


def _cluster(actor: User, team: Team, name: str | None) -> Cluster | None:
    """A team admin chooses among the clusters the team may use (any other gets the 404 of an
    unknown cluster); staff choose any cluster, and so grant it, as in the admin."""
    if not name:
        return None
    name = _text("a cluster name", name)
    if not actor.is_staff:
        return grants.usable_cluster(team, name)
    cluster = grants.any_cluster(name)
    grants.grant(team, cluster, actor.username)
    return cluster


def _window(name: str | None) -> ScheduleWindow | None:
    return named(ScheduleWindow, name, "schedule window", "windows") if name else None


def named(model: Any, name: str, noun: str, plural: str) -> Any:
    """The row of `model` called `name`, or a 400 naming the ones that exist."""
    row = model.objects.filter(name=_text(f"a {noun} name", name)).first()
    if row is None:
        known = ", ".join(model.objects.order_by("name").values_list("name", flat=True))
        raise BadRequest(f"unknown {noun} {name!r}; known {plural}: {known or 'none'}")
    return row


def _text(what: str, value: str) -> str:
    """A name from a form or a path, refused with a sentence where the ledger cannot hold it
    (NUL, a lone surrogate) rather than failing in the database."""
    fault = text_fault(value)
    if fault:
        raise BadRequest(f"{what} {fault}")
    return value


def _in_range(field: str, value: Any, limit: int, low: int = 0) -> int:
    if type(value) is not int or not low <= value <= limit:
        raise BadRequest(f"{field} must be a whole number from {low} to {limit}, got {value!r}")
    return value


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise BadRequest(f"unknown role {role!r}; one of {', '.join(ROLES)}")


def _managed_team(actor: User, name: str) -> Team:
    """The team, row-locked, if the actor may manage it; 404 outside it, 403 for non-admins."""
    team = Team.objects.select_for_update().get(pk=get_team(actor, name).pk)
    # Read after the lock: an admin demoted a moment ago no longer manages.
    is_admin = Membership.objects.filter(team=team, user=actor, role=Membership.Role.ADMIN)
    if not (actor.is_staff or is_admin.exists()):
        raise Forbidden(f"only team admins of team {name} can manage its members")
    return team


def _membership(team: Team, username: str) -> Membership:
    username = _text("a user name", username)
    membership = (
        Membership.objects.select_related("user").filter(team=team, user__username=username).first()
    )
    if membership is None:
        raise NotFound(f"{username} is not a member of team {team.name}")
    return membership


def _keep_an_admin(team: Team, username: str, change: str) -> None:
    others = Membership.objects.filter(team=team, role=Membership.Role.ADMIN).exclude(
        user__username=username
    )
    if not others.exists():
        raise Conflict(
            f"{username} is the last admin of team {team.name}: make another member admin "
            f"before you {change}"
        )


def _membership_changed(actor: User, team: Team, user: User, what: str) -> None:
    log.info("team %s: %s %s by %s", team.name, user.username, what, actor.username)
    broadcast.publish_membership_changed(user.pk)
