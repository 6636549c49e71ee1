"""The audit log page (`/audit/`): the rows the reader may read (`jobs.reads.audit`: staff all,
a team admin their teams'), filtered by actor, action, target, team and time, a page at a time,
and the same filters as CSV (`?format=csv`). Another team: the 404 of an unknown team."""

import datetime as dt
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs.errors import BadRequest, NotFound
from jobs.reads import audit as audit_reads
from jobs.schemas import text_fault

PAGE = 100
FILTERS = ("actor", "action", "target", "team", "since", "until")


@login_required
def audit_page(request):
    try:
        wanted = _wanted(request.GET)
        if request.GET.get("format") == "csv":
            rows = audit_reads.all_entries(request.user, wanted)
            response = StreamingHttpResponse(
                audit_reads.csv_chunks(rows), content_type="text/csv; charset=utf-8"
            )
            response["Content-Disposition"] = 'attachment; filename="starforge-audit.csv"'
            return response
        page = audit_reads.entries(request.user, wanted)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    except BadRequest as exc:
        return HttpResponseBadRequest(exc.detail, content_type="text/plain; charset=utf-8")
    more = len(page) > PAGE
    page = page[:PAGE]
    form = {k: request.GET.get(k, "") for k in FILTERS}
    return render(
        request,
        "jobs/audit.html",
        {
            "entries": page,
            "form": form,
            "next_before": page[-1].pk if more else None,
            "query": urlencode({k: v for k, v in form.items() if v}),
            "reads_any": audit_reads.may_read_audit(request.user),
        },
    )


def _wanted(form) -> audit_reads.AuditFilter:
    texts = {}
    for name in FILTERS:
        value = form.get(name, "").strip()
        if value and (fault := text_fault(value)):
            raise BadRequest(f"the {name} filter {fault}")
        texts[name] = value[:200] or None
    before = form.get("before", "")
    if before and not (before.isascii() and before.isdigit() and len(before) < 19):
        raise BadRequest("before must be an entry id")
    return audit_reads.AuditFilter(
        actor=texts["actor"],
        action=texts["action"],
        target=texts["target"],
        team=texts["team"],
        since=_time("since", texts["since"]),
        until=_time("until", texts["until"]),
        before=int(before) if before else None,
        limit=PAGE,
    )


def _time(name: str, text: str | None) -> dt.datetime | None:
    """A time filter: ISO 8601 or the browser's datetime-local (UTC when it names no zone)."""
    if text is None:
        return None
    try:
        moment = parse_datetime(text)
    except ValueError:
        moment = None
    if moment is None:
        raise BadRequest(f"{name} must be a time such as 2026-12-07T09:30, not {text[:40]!r}")
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=dt.UTC)
    return moment
