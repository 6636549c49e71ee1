"""The teams API (`/api/v1/teams`): members read their teams; team admins (and staff) manage
members and the team's defaults. Quotas are staff's, through the Django admin, and so are the
clusters a team may use: staff grant and revoke them here too (`jobs.grants`)."""

from typing import Literal

from ninja import Router, Schema, Status
from pydantic import Field

from jobs import grants
from jobs.actions import teams as team_actions
from jobs.auth import ConsoleSession, UserToken
from jobs.models import Team
from jobs.reads import teams
from jobs.schemas import ErrorOut, Text

# Same doors as the jobs API: a token for the CLI, the session (CSRF-checked) for the console.
router = Router(auth=[UserToken(), ConsoleSession()], tags=["teams"])
Role = Literal["member", "viewer", "admin"]


class MemberOut(Schema):
    username: str
    role: str


class QuotasOut(Schema):
    gpu_quota: int
    max_jobs: int | None
    gpu_hours_per_month: float | None
    money_budget_per_month: str | None = Field(description="in the server's currency")
    budget_alert_percents: str = Field(description="alert thresholds, percents of it")
    budget_hard_stop: bool
    user_gpu_cap: int | None
    max_gpus_per_job: int | None
    max_member_priority: int


class DefaultsOut(Schema):
    default_cluster: str | None
    window: str | None
    default_max_retries: int
    default_retry_cooldown_s: int
    default_time_limit_s: int | None


class TeamDetailOut(Schema):
    name: str
    role: str | None = Field(description="your role in the team; null for staff outside it")
    can_manage: bool = Field(description="you may manage its members and defaults")
    members: list[MemberOut]
    quotas: QuotasOut = Field(description="set by staff in the Django admin")
    defaults: DefaultsOut
    clusters: list[str] = Field(description="the clusters the team may use, granted by staff")


class InheritedJobOut(Schema):
    id: int
    name: str
    status: str
    user: str = Field(description="who submitted it")
    why: str = Field(description="why they may no longer submit in the team")


class MemberIn(Schema):
    username: Text = Field(..., max_length=150)
    role: Role = "member"


class RoleIn(Schema):
    role: Role


class GrantIn(Schema):
    cluster: Text = Field(..., max_length=50, description="a cluster's name")


class GrantOut(Schema):
    team: str
    cluster: str
    granted: bool = Field(description="true: granted now; false: the team could already use it")


class RevokedOut(Schema):
    team: str
    cluster: str
    default_cleared: bool = Field(description="it was the team's default cluster, now none")
    queued: int = Field(
        description="the team's QUEUED jobs on the cluster, which the scheduler's next tick stops"
    )


class DefaultsIn(Schema):
    # Only the fields sent change; null clears the cluster or the window. Ranges are checked
    # by `team_actions.set_defaults`, so the console gets the same sentences.
    default_cluster: Text | None = Field(None, max_length=50, description="a cluster's name")
    window: Text | None = Field(None, max_length=50, description="a schedule window's name")
    default_max_retries: int | None = Field(None, strict=True, description="0..100")
    default_retry_cooldown_s: int | None = Field(None, strict=True, description="0..86400")
    default_time_limit_s: int | None = Field(
        None, strict=True, description="1..2592000 seconds; null: no limit"
    )


def team_out(user, team: Team) -> dict:
    quota, money = team.gpu_hours_per_month, team.money_budget_per_month
    return {
        "name": team.name,
        "role": teams.role_of(user, team),
        "can_manage": teams.can_manage(user, team),
        "members": [
            {"username": m.user.username, "role": m.role}
            for m in team.memberships  # type: ignore[attr-defined]
        ],
        "quotas": {
            "gpu_quota": team.gpu_quota,
            "max_jobs": team.max_jobs,
            "gpu_hours_per_month": float(quota) if quota is not None else None,
            "money_budget_per_month": None if money is None else str(money),
            "budget_alert_percents": team.budget_alert_percents,
            "budget_hard_stop": team.budget_hard_stop,
            "user_gpu_cap": team.user_gpu_cap,
            "max_gpus_per_job": team.max_gpus_per_job,
            "max_member_priority": team.max_member_priority,
        },
        "defaults": {
            "default_cluster": team.default_cluster.name if team.default_cluster else None,
            "window": team.window.name if team.window else None,
            "default_max_retries": team.default_max_retries,
            "default_retry_cooldown_s": team.default_retry_cooldown_s,
            "default_time_limit_s": team.default_time_limit_s,
        },
        "clusters": teams.cluster_names(team),
    }


@router.get(
    "/teams",
    response={200: list[TeamDetailOut], (401, 429): ErrorOut},
    summary="My teams (every team for staff)",
)
def list_teams(request):
    return [team_out(request.auth, team) for team in teams.visible_teams(request.auth)]


@router.get(
    "/teams/{name}",
    response={200: TeamDetailOut, (401, 404, 422, 429): ErrorOut},
    summary="One of my teams",
)
def get_team(request, name: Text):
    return team_out(request.auth, teams.get_team(request.auth, name))


@router.patch(
    "/teams/{name}",
    response={200: TeamDetailOut, (400, 401, 403, 404, 413, 422, 429): ErrorOut},
    summary="Set the team's defaults",
)
def set_defaults(request, name: Text, data: DefaultsIn):
    team = team_actions.set_defaults(request.auth, name, data.model_dump(exclude_unset=True))
    return team_out(request.auth, team)


@router.post(
    "/teams/{name}/members",
    response={201: MemberOut, (400, 401, 403, 404, 409, 413, 422, 429): ErrorOut},
    summary="Add a member with a role",
)
def add_member(request, name: Text, data: MemberIn):
    membership = team_actions.add_member(request.auth, name, data.username, data.role)
    return Status(201, {"username": data.username, "role": membership.role})


@router.patch(
    "/teams/{name}/members/{username}",
    response={200: MemberOut, (400, 401, 403, 404, 409, 413, 422, 429): ErrorOut},
    summary="Change a member's role",
)
def change_role(request, name: Text, username: Text, data: RoleIn):
    membership = team_actions.change_role(request.auth, name, username, data.role)
    return {"username": username, "role": membership.role}


@router.delete(
    "/teams/{name}/members/{username}",
    response={204: None, (401, 403, 404, 409, 422, 429): ErrorOut},
    summary="Remove a member",
)
def remove_member(request, name: Text, username: Text):
    team_actions.remove_member(request.auth, name, username)
    return Status(204, None)


@router.get(
    "/teams/{name}/inherited-jobs",
    response={200: list[InheritedJobOut], (401, 403, 404, 422, 429): ErrorOut},
    summary="Running jobs of members who left or were deactivated (team admins)",
)
def inherited_jobs(request, name: Text):
    return [
        {"id": j.job_id, "name": j.name, "status": j.status, "user": j.username, "why": j.why}
        for j in teams.inherited_jobs(request.auth, name)
    ]


@router.post(
    "/teams/{name}/clusters",
    response={(200, 201): GrantOut, (400, 401, 403, 404, 413, 422, 429): ErrorOut},
    summary="Let the team use a cluster (staff)",
)
def grant_cluster(request, name: Text, data: GrantIn):
    cluster, granted = grants.grant_named(
        request.auth, teams.get_team(request.auth, name), data.cluster
    )
    body = {"team": name, "cluster": cluster.name, "granted": granted}
    return Status(201 if granted else 200, body)


@router.delete(
    "/teams/{name}/clusters/{cluster}",
    response={200: RevokedOut, (401, 403, 404, 422, 429): ErrorOut},
    summary="Take a cluster from the team (staff)",
)
def revoke_cluster(request, name: Text, cluster: Text):
    revoked = grants.revoke_named(request.auth, teams.get_team(request.auth, name), cluster)
    return {
        "team": name,
        "cluster": cluster,
        "default_cleared": revoked.default_cleared,
        "queued": revoked.queued,
    }
