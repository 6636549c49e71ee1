"""The team verbs a team admin (or staff) uses: add and remove members, change roles, set the
team's defaults. Quotas are staff's alone, through the Django admin. API and console both come
through here; who may read a team is `jobs.reads.teams`.

Each change locks the team row first, so two admins demoting each other at once cannot leave
a team without an admin. Live pages a change concerns are told after commit (`jobs.broadcast`), so
a removed member's open websockets stop at once rather than at their next reconnect. Their
waiting work in the team stops in the same transaction, whatever removed them
(`jobs.signals`, `jobs.ledger.departures`); `jobs.reads.teams.inherited_jobs` lists what still
runs.
"""

import logging
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from jobs import broadcast, grants
from jobs.errors import BadRequest, Conflict, Forbidden, NotFound
from jobs.models import TIME_LIMIT_MAX_S, Cluster, Membership, ScheduleWindow, Team
from jobs.reads.teams import checked_name, get_team, named

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


def add_member(actor: User, team_name: str, username: str, role: str) -> Membership:
    with transaction.atomic():
        team = _managed_team(actor, team_name)
        _check_role(role)
        user = User.objects.filter(username=checked_name("a user name", username)).first()
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


def provision_member(team: Team, user: User, role: str | None, by: str) -> bool:
    """The identity provider's say on one person's place in a team (`jobs.scim`'s group
    members, `jobs.oidc`'s group mapping at each sign-in): `role` None removes them, a role adds
    them or sets their role. The IdP is the authority here, so the last-admin rule of a team
    admin's own changes does not apply. A removal deletes the row, so `jobs.signals` stops their
    waiting work as for any other removal. Returns whether anything changed."""
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        existing = Membership.objects.filter(team=team, user=user).first()
        if role is None:
            if existing is None:
                return False
            existing.delete()
            what = "removed"
        elif existing is None:
            _check_role(role)
            Membership.objects.create(team=team, user=user, role=role)
            what = f"added as {role}"
        elif existing.role != role:
            _check_role(role)
            Membership.objects.filter(pk=existing.pk).update(role=role)
            what = f"role set to {role}"
        else:
            return False
        log.info("team %s: %s %s by %s", team.name, user.username, what, by)
        broadcast.publish_membership_changed(user.pk)
    return True


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
    name = checked_name("a cluster name", name)
    if not actor.is_staff:
        return grants.usable_cluster(team, name)
    cluster = grants.any_cluster(name)
    grants.grant(team, cluster, actor.username)
    return cluster


def _window(name: str | None) -> ScheduleWindow | None:
    return named(ScheduleWindow, name, "schedule window", "windows") if name else None


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
    username = checked_name("a user name", username)
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
