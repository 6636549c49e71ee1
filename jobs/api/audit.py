"""The audit log API (`/api/v1/audit`): staff read every row, a team admin their teams' rows
(`jobs.reads.audit`); paginated newest first, filtered by actor, action, target, team and time;
`/api/v1/audit.csv` gives every matching row as CSV. Another team's rows are never listed, and
naming another team or one of its rows is a 404."""

import datetime as dt
from typing import Any

from django.http import StreamingHttpResponse
from ninja import Query, Router, Schema
from pydantic import Field

from jobs.audited import AuditEntry
from jobs.auth import ConsoleSession, UserToken
from jobs.reads import audit as audit_reads
from jobs.schemas import ErrorOut, Text

router = Router(auth=[UserToken(), ConsoleSession()], tags=["audit"])


class AuditQuery(Schema):
    actor: Text | None = Field(None, max_length=150, description="the person's username")
    action: Text | None = Field(
        None, max_length=64, description='an action ("job.stop"), or a prefix ending in "."'
    )
    target: Text | None = Field(
        None, max_length=200, description='a kind ("job"), or kind:id or kind:label ("job:7")'
    )
    team: Text | None = Field(None, max_length=50, description="a team you administer")
    since: dt.datetime | None = Field(None, description="from this time on (ISO 8601)")
    until: dt.datetime | None = Field(None, description="before this time (ISO 8601)")
    before: int | None = Field(None, ge=1, le=2**62, description="entry id to page back from")
    limit: int = Field(50, ge=1, le=audit_reads.PAGE_MAX)


class AuditOut(Schema):
    id: int
    time: dt.datetime
    actor: str
    token_prefix: str = Field(description="the prefix of the API token used; empty: none")
    door: str = Field(description="api, console, admin, scim, sign-in or command")
    action: str
    target_type: str
    target_id: str
    target: str
    team: str
    before: Any = Field(None, description="the settings changed, as they were")
    after: Any = Field(None, description="the settings changed, as they became")
    address: str


class AuditPage(Schema):
    items: list[AuditOut]
    next_before: int | None = Field(None, description="pass as before= for the next page")


def _wanted(query: AuditQuery, paged: bool = True) -> audit_reads.AuditFilter:
    return audit_reads.AuditFilter(
        actor=query.actor,
        action=query.action,
        target=query.target,
        team=query.team,
        since=query.since,
        until=query.until,
        before=query.before if paged else None,
        limit=query.limit,
    )


def entry_out(e: AuditEntry) -> dict:
    shown = {f: getattr(e, f) for f in AuditOut.model_fields if f not in ("id", "token_prefix")}
    return shown | {"id": e.pk, "token_prefix": e.token}


@router.get(
    "/audit",
    response={200: AuditPage, (400, 401, 404, 422, 429): ErrorOut},
    summary="The audit log: every change of the teams you administer (staff: all), newest first",
)
def list_audit(request, query: Query[AuditQuery]):
    page = audit_reads.entries(request.auth, _wanted(query))
    more = len(page) > query.limit
    page = page[: query.limit]
    return {"items": [entry_out(e) for e in page], "next_before": page[-1].pk if more else None}


@router.get(
    "/audit.csv",
    response={200: None, (400, 401, 404, 422, 429): ErrorOut},
    summary="Every matching audit entry as CSV (same filters; no paging)",
)
def audit_csv(request, query: Query[AuditQuery]) -> StreamingHttpResponse:
    return csv_response(audit_reads.all_entries(request.auth, _wanted(query, paged=False)))


@router.get(
    "/audit/{entry_id}",
    response={200: AuditOut, (401, 404, 422, 429): ErrorOut},
    summary="One audit entry",
)
def get_audit(request, entry_id: int):
    return entry_out(audit_reads.get_entry(request.auth, entry_id))


def csv_response(rows) -> StreamingHttpResponse:
    response = StreamingHttpResponse(
        audit_reads.csv_chunks(rows), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = 'attachment; filename="starforge-audit.csv"'
    return response
