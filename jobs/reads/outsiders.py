"""Jobs whose submitter may no longer submit in the job's team: removed from it, made a viewer,
or deactivated (docs/ARCHITECTURE.md, "Membership bounds a member's reach"). Their waiting
work is stopped (`jobs.ledger.departures`); what already runs goes on as the team's work, and
`inherited` lists it for the team's admins. Nothing here writes.

"May submit" is submit's own rule (`jobs.actions.submit`): an active user who is a member or
an admin of the team. Staff are no exception there, so none here.
"""

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import Exists, OuterRef, Q, QuerySet

from jobs.models import Job, Membership, Team
from jobs.states import JobStatus

MAY_SUBMIT = (Membership.Role.MEMBER, Membership.Role.ADMIN)


def outsiders(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Those of `jobs` whose submitter may no longer submit in the job's team. A NOT EXISTS and
    a small IN (inactive users are few), so a long queue costs one anti-join, not a join."""
    may_submit = Membership.objects.filter(
        team_id=OuterRef("team_id"), user_id=OuterRef("user_id"), role__in=MAY_SUBMIT
    )
    inactive = User.objects.filter(is_active=False).values("pk")
    return jobs.filter(~Exists(may_submit) | Q(user_id__in=inactive))


def why_not(username: str, team_name: str, active: bool, role: str | None) -> str:
    """Why this submitter may no longer submit in the team, as a clause of a sentence."""
    if not active:
        return f"{username}'s account is deactivated"
    if role is None:
        return f"{username} is no longer a member of team {team_name}"
    return f"{username} is now a {role} in team {team_name}, and a {role} cannot submit jobs"


@dataclass(frozen=True)
class Outsider:
    """One job of an outsider, with why its submitter may no longer submit."""

    job_id: int
    name: str
    status: str
    username: str
    why: str


def described(jobs: QuerySet[Job]) -> list[Outsider]:
    """`outsiders(jobs)` with their reasons: two queries, whatever their number."""
    rows = list(
        outsiders(jobs)
        .order_by("pk")
        .values_list(
            "pk", "name", "status", "user_id", "user__username", "user__is_active",
            "team_id", "team__name",
        )
    )  # fmt: skip
    roles = dict(
        ((user, team), role)
        for user, team, role in Membership.objects.filter(
            user_id__in={r[3] for r in rows}, team_id__in={r[6] for r in rows}
        ).values_list("user_id", "team_id", "role")
    )
    return [
        Outsider(pk, name, status, username, why_not(username, team, active, roles.get((u, t))))
        for pk, name, status, u, username, active, t, team in rows
    ]


def inherited(team: Team) -> list[Outsider]:
    """The team's jobs that run (or are being launched) for a submitter who may no longer
    submit in it: the team's work now, which its admins may stop."""
    return described(Job.objects.filter(team=team, status__in=JobStatus.active()))
