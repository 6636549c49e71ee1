"""Teams as a member reads them: which teams a user sees, their role there, and what follows
from it (who manages a team, who controls its jobs, which team a snapshot upload is for).

Every member reads their teams (members, quotas, defaults, the clusters it may use); staff read
every team. The changes a team admin makes are `jobs.actions.teams`. Nothing here writes.
"""

from typing import Any

from django.contrib.auth.models import User
from django.db.models import Prefetch, QuerySet

from jobs.errors import BadRequest, Forbidden, NotFound
from jobs.models import ClusterGrant, Membership, Team
from jobs.reads import outsiders
from jobs.schemas import text_fault


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


def named(model: Any, name: str, noun: str, plural: str) -> Any:
    """The row of `model` called `name`, or a 400 naming the ones that exist."""
    row = model.objects.filter(name=checked_name(f"a {noun} name", name)).first()
    if row is None:
        known = ", ".join(model.objects.order_by("name").values_list("name", flat=True))
        raise BadRequest(f"unknown {noun} {name!r}; known {plural}: {known or 'none'}")
    return row


def checked_name(what: str, value: str) -> str:
    """A name from a form or a path, refused with a sentence where the ledger cannot hold it
    (NUL, a lone surrogate) rather than failing in the database."""
    fault = text_fault(value)
    if fault:
        raise BadRequest(f"{what} {fault}")
    return value
