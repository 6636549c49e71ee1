"""The usage API (`/api/v1/usage`): GPU-hours of the caller's teams, their cost and what the GPUs
did (active and idle GPU-hours, efficiency), grouped one way (team, user, cluster, GPU type, UTC
day); GPU prices (`/api/v1/prices`: read by members for their teams' clusters, added by staff)
and a team's money budget (`/api/v1/teams/NAME/budget`, staff: `jobs.actions.money`); the
accounting export (`/api/v1/usage/export`: sacct's fields per attempt, `metering.export`)."""

import datetime as dt
import re
from typing import Literal

from django.http import HttpResponse
from django.utils import timezone
from ninja import Query, Router, Schema, Status
from pydantic import Field

from jobs.actions import money
from jobs.auth import ConsoleSession, UserToken
from jobs.errors import BadRequest
from jobs.schemas import ErrorOut, Text
from metering import export
from metering.cost import team_month_cost
from metering.prices import amount, currency, price_out, visible_prices
from metering.usage import (
    Dimension,
    gpu_hours,
    gpu_seconds,
    totals_by,
    usage_lines,
    usage_teams,
)

router = Router(auth=[UserToken(), ConsoleSession()], tags=["usage"])
MAX_DAYS = 366
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class UsageQuery(Schema):
    team: Text | None = Field(None, max_length=50, description="one team (default: all of yours)")
    since: str | None = Field(None, description="first UTC day, YYYY-MM-DD (default: 1st of month)")
    until: str | None = Field(
        None, description="UTC day after the last, YYYY-MM-DD (default: tomorrow)"
    )
    by: Dimension = "team"


class UsageRowOut(Schema):
    team: str | None = None
    user: str | None = None
    cluster: str | None = None
    gpu_type: str | None = Field(
        None, description="the GPU type the jobs asked for, which prices them; empty: any"
    )
    day: dt.date | None = None
    gpu_seconds: float
    gpu_hours: float
    borrowed_gpu_hours: float = Field(
        description="the part of gpu_hours that ran on GPUs borrowed from other teams"
    )
    cost: str = Field(description="at the prices in force when it ran: a decimal string")
    active_gpu_hours: float = Field(
        description="the part of gpu_hours whose GPUs worked, by the runners' activity reports"
    )
    idle_gpu_hours: float = Field(description="the part of gpu_hours whose GPUs idled")
    efficiency: float | None = Field(description="active_gpu_hours / gpu_hours")


class UsageOut(Schema):
    since: dt.date
    until: dt.date = Field(description="exclusive: the day after the last one counted")
    by: Dimension
    rows: list[UsageRowOut]
    total_gpu_seconds: float
    total_gpu_hours: float
    total_cost: str
    currency: str


@router.get(
    "/usage",
    response={200: UsageOut, (400, 401, 404, 422, 429): ErrorOut},
    exclude_none=True,
    summary="GPU-hours of my teams by team, user, cluster, GPU type or UTC day",
)
def usage(request, query: Query[UsageQuery]):
    today = timezone.now().astimezone(dt.UTC).date()
    since = _day("since", query.since) or today.replace(day=1)
    until = _day("until", query.until) or today + dt.timedelta(days=1)
    if since > until:
        raise BadRequest(f"since {since} is after until {until}")
    if (until - since).days > MAX_DAYS:
        raise BadRequest(
            f"since {since} to until {until} is {(until - since).days} days; "
            f"ask for at most {MAX_DAYS} at a time"
        )
    lines = usage_lines(usage_teams(request.auth, query.team), since, until)
    borrowed = dict(totals_by(lines, query.by, borrowed=True))
    costs = dict(totals_by(lines, query.by, cost=True))
    active = dict(totals_by(lines, query.by, figure="active_us"))
    idle = dict(totals_by(lines, query.by, figure="idle_us"))
    rows = [
        {
            query.by: value,
            "gpu_seconds": gpu_seconds(gpu_us),
            "gpu_hours": gpu_hours(gpu_us),
            "borrowed_gpu_hours": gpu_hours(borrowed.get((value,), 0)),
            "cost": amount(costs.get((value,), 0)),
            "active_gpu_hours": gpu_hours(active.get((value,), 0)),
            "idle_gpu_hours": gpu_hours(idle.get((value,), 0)),
            "efficiency": round(active.get((value,), 0) / gpu_us, 4) if gpu_us else None,
        }
        for (value,), gpu_us in totals_by(lines, query.by)
    ]
    total = sum(line.gpu_us for line in lines)
    return {
        "since": since,
        "until": until,
        "by": query.by,
        "rows": rows,
        "total_gpu_seconds": gpu_seconds(total),
        "total_gpu_hours": gpu_hours(total),
        "total_cost": amount(sum(line.cost_micros for line in lines)),
        "currency": currency(),
    }


class ExportQuery(Schema):
    start: str | None = Field(
        None, max_length=40, description="UTC, YYYY-MM-DD or ISO 8601 (default: 1st of month)"
    )
    end: str | None = Field(None, max_length=40, description="UTC, exclusive (default: now)")
    format: Literal["csv", "json"] = "csv"


class ExportOut(Schema):
    columns: list[str]
    rows: list[dict[str, str]] = Field(description="one per attempt, sacct's field names")


@router.get(
    "/usage/export",
    response={200: ExportOut, (400, 401, 422, 429): ErrorOut},
    summary="Accounting export: one sacct-shaped record per attempt, CSV or JSON",
    # `format=csv` (the default) answers CSV, `format=json` the schema's JSON.
    openapi_extra={
        "responses": {
            "200": {
                "description": "OK",
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ExportOut"}},
                    "text/csv": {"schema": {"type": "string"}},
                },
            }
        }
    },
)
def usage_export(request, query: Query[ExportQuery]):
    now = timezone.now()
    start = _instant("start", query.start) or dt.datetime.combine(
        now.astimezone(dt.UTC).date().replace(day=1), dt.time(), dt.UTC
    )
    end = _instant("end", query.end) or now
    if start >= end:
        raise BadRequest(
            f"start {start:%Y-%m-%dT%H:%M:%S} is not before end {end:%Y-%m-%dT%H:%M:%S}"
        )
    if (end - start).days > MAX_DAYS:
        raise BadRequest(f"ask for at most {MAX_DAYS} days at a time")
    try:
        rows = export.export_rows(request.auth, start, end, now)
    except export.TooMany as exc:
        raise BadRequest(str(exc)) from None
    if query.format == "csv":
        answer = HttpResponse(export.as_csv(rows), content_type="text/csv; charset=utf-8")
        answer["Content-Disposition"] = 'attachment; filename="starforge-accounting.csv"'
        return answer
    return {"columns": list(export.COLUMNS), "rows": rows}


def _instant(name: str, text: str | None) -> dt.datetime | None:
    """A UTC day or ISO 8601 instant (naive: UTC)."""
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(f"{name} must be YYYY-MM-DD or an ISO 8601 time, got {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _day(name: str, text: str | None) -> dt.date | None:
    if not text:
        return None
    try:
        if not DATE.fullmatch(text):
            raise ValueError
        return dt.date.fromisoformat(text)
    except ValueError:
        raise BadRequest(f"{name} must be a UTC day as YYYY-MM-DD, got {text!r}") from None


class PriceIn(Schema):
    cluster: Text = Field(..., max_length=50)
    gpu_type: Text = Field("", max_length=64, description="empty: the cluster's default price")
    per_gpu_hour: str = Field(..., max_length=30, description='a decimal string, e.g. "2.50"')
    valid_from: dt.datetime | None = Field(None, description="default now; never in the past")


class PriceOut(Schema):
    cluster: str
    gpu_type: str
    per_gpu_hour: str
    valid_from: dt.datetime
    currency: str


class BudgetIn(Schema):
    # Only the fields sent change; null clears the budget.
    money_budget_per_month: str | None = Field(
        None, max_length=30, description='a decimal string, e.g. "5000"; null: no budget'
    )
    budget_alert_percents: Text | None = Field(None, max_length=100, description="e.g. 50,80,100")
    budget_hard_stop: bool | None = None


class BudgetOut(Schema):
    team: str
    money_budget_per_month: str | None
    budget_alert_percents: str
    budget_hard_stop: bool
    spent_this_month: str
    currency: str


@router.get(
    "/prices",
    response={200: list[PriceOut], (401, 429): ErrorOut},
    summary="GPU prices of the clusters my teams may use (every cluster for staff)",
)
def prices(request):
    return [price_out(p) for p in visible_prices(request.auth)]


@router.post(
    "/prices",
    response={201: PriceOut, (400, 401, 403, 409, 422, 429): ErrorOut},
    summary="Add a GPU price from a moment on (staff)",
)
def add_price(request, body: PriceIn):
    made = money.add_price(
        request.auth, body.cluster, body.gpu_type, body.per_gpu_hour, body.valid_from
    )
    return Status(201, price_out(made))


@router.put(
    "/teams/{name}/budget",
    response={200: BudgetOut, (400, 401, 403, 404, 422, 429): ErrorOut},
    summary="Set a team's money budget, alert thresholds and hard stop (staff)",
)
def set_budget(request, name: str, body: BudgetIn):
    team = money.set_money_budget(request.auth, name, body.dict(exclude_unset=True))
    budget = team.money_budget_per_month
    return {
        "team": team.name,
        "money_budget_per_month": None if budget is None else str(budget),
        "budget_alert_percents": team.budget_alert_percents,
        "budget_hard_stop": team.budget_hard_stop,
        "spent_this_month": amount(team_month_cost().get(team.pk, 0)),
        "currency": currency(),
    }
