"""A team's idle and hang policy (`/api/v1/teams/{name}/activity-policy`) and a job's
exemption from the idle policy (`/api/v1/jobs/{id}/idle-exemption`): read by members, set by
the team's admins and staff (`jobs.actions.activity`)."""

from typing import Literal

from django.utils import timezone
from ninja import Router, Schema
from pydantic import Field

from jobs.actions import activity as actions
from jobs.auth import ConsoleSession, UserToken
from jobs.reads.teams import get_team
from jobs.schemas import ErrorOut, Text

router = Router(auth=[UserToken(), ConsoleSession()], tags=["teams"])


class PolicyOut(Schema):
    idle_after_s: int | None = Field(description="idle this long: warned; null: never")
    idle_grace_s: int = Field(description="after the warning: the notice, then idle_action")
    idle_action: Literal["pause", "stop"]
    hang_after_s: int | None = Field(description="stalled this long: a suspected hang")
    hang_action: Literal["notify", "fail", "stop"]


class PolicyIn(Schema):
    # Only the fields sent change; null turns idle_after_s or hang_after_s off.
    idle_after_s: int | None = Field(None, strict=True, description="1..2592000; null: off")
    idle_grace_s: int | None = Field(None, strict=True, description="1..2592000")
    idle_action: Literal["pause", "stop"] | None = None
    hang_after_s: int | None = Field(None, strict=True, description="1..2592000; null: off")
    hang_action: Literal["notify", "fail", "stop"] | None = None


class ExemptionIn(Schema):
    reason: Text = Field("", max_length=200)


class ExemptionOut(Schema):
    job: int
    by: str
    at: str
    reason: str


@router.get(
    "/teams/{name}/activity-policy",
    response={200: PolicyOut, (401, 404, 422, 429): ErrorOut},
    summary="The team's idle and hang policy",
)
def get_policy(request, name: Text):
    return actions.policy_of(get_team(request.auth, name).pk)


@router.patch(
    "/teams/{name}/activity-policy",
    response={200: PolicyOut, (400, 401, 403, 404, 413, 422, 429): ErrorOut},
    summary="Set the team's idle and hang policy (team admins and staff)",
)
def set_policy(request, name: Text, data: PolicyIn):
    changes = data.model_dump(exclude_unset=True)
    return actions.set_policy(request.auth, name, changes)


@router.post(
    "/jobs/{job_id}/idle-exemption",
    response={200: ExemptionOut, (400, 401, 403, 404, 413, 422, 429): ErrorOut},
    summary="Exempt a job from its team's idle policy (team admins and staff)",
)
def exempt_job(request, job_id: int, data: ExemptionIn):
    row = actions.exempt(request.auth, job_id, data.reason, timezone.now())
    return {"job": job_id, "by": row.by.username, "at": row.at.isoformat(), "reason": row.reason}


@router.delete(
    "/jobs/{job_id}/idle-exemption",
    response={204: None, (401, 403, 404, 422, 429): ErrorOut},
    summary="Let the team's idle policy apply to the job again (team admins and staff)",
)
def lift_exemption(request, job_id: int):
    actions.lift_exemption(request.auth, job_id, timezone.now())
    return 204, None
