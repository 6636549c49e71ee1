"""The usage page (`/usage/`): a month of GPU-hours, their cost and what the GPUs did (active and
idle GPU-hours, efficiency = active ÷ billed) by team, user, cluster, GPU type and UTC day, a
chart stacked by team, and the same month as CSV (`?format=csv`). Reads only the usage records
plus the attempts not recorded yet (`metering.usage.usage_lines`)."""

import csv
import datetime as dt
import json
import re

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest, HttpResponseNotFound
from django.shortcuts import render
from django.utils import timezone

from jobs.errors import NotFound
from jobs.reads.teams import visible_teams
from jobs.schemas import text_fault
from metering.prices import amount, currency, shown
from metering.usage import (
    Dimension,
    UsageLine,
    gpu_hours,
    gpu_seconds,
    totals_by,
    usage_lines,
    usage_teams,
)

MONTH = re.compile(r"(\d{4})-(\d{2})")
# How the page names the usage of jobs that asked for no GPU type (""): a type name cannot hold
# a space, so no real type reads the same.
ANY_TYPE = "any type"
# The page's tables: each groups the month's lines by these.
TABLES: dict[str, tuple[Dimension, ...]] = {
    "team": ("team",),
    "user": ("team", "user"),
    "cluster": ("cluster",),
    "gpu_type": ("gpu_type",),
    "day": ("day",),
}
# The usage CSV: one row per (day, team, user, cluster, GPU type; "": any); efficiency =
# active ÷ billed GPU-time.
CSV_COLUMNS = (
    "day", "team", "user", "cluster", "gpu_type", "gpu_hours", "gpu_seconds",
    "borrowed_gpu_hours", "active_gpu_seconds", "idle_gpu_seconds", "efficiency", "cost",
    "currency",
)  # fmt: skip


@login_required
def usage_page(request):
    try:
        month = _month(request.GET.get("month", ""))
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    team = request.GET.get("team") or None
    if team is not None and (fault := text_fault(team)):  # PostgreSQL cannot compare it
        return HttpResponseBadRequest(
            f"The team filter {fault}.\n", content_type="text/plain; charset=utf-8"
        )
    try:
        teams = usage_teams(request.user, team)
    except NotFound as exc:
        return HttpResponseNotFound(exc.detail, content_type="text/plain; charset=utf-8")
    until = (month + dt.timedelta(days=32)).replace(day=1)
    lines = usage_lines(teams, month, until)
    if request.GET.get("format") == "csv":
        return _csv(lines, month)
    return render(
        request,
        "metering/usage.html",
        {
            "month": month,
            "team": team,
            "teams": visible_teams(request.user).values_list("name", flat=True),
            "tables": {name: usage_table(lines, *dims) for name, dims in TABLES.items()},
            "total": gpu_hours(sum(line.gpu_us for line in lines)),
            "total_cost": shown(sum(line.cost_micros for line in lines)),
            "chart": json.dumps(stacked_chart(lines)),
        },
    )


def usage_table(lines: list[UsageLine], *dims: Dimension) -> list[dict]:
    """One row per value of `dims`, sorted: its names (`names`, a GPU type named as the page
    shows it), GPU-hours, the part on borrowed GPUs, cost, active and idle GPU-hours and the
    efficiency (active ÷ billed, None without GPU-time)."""
    figures = {
        figure: dict(totals_by(lines, *dims, figure=figure))
        for figure in ("borrowed_us", "cost_micros", "active_us", "idle_us")
    }
    return [
        {
            "names": [
                (value or ANY_TYPE) if dim == "gpu_type" else value
                for dim, value in zip(dims, key, strict=True)
            ],
            "hours": gpu_hours(gpu_us),
            "borrowed": gpu_hours(figures["borrowed_us"][key]),
            "cost": shown(figures["cost_micros"][key]),
            "active": gpu_hours(figures["active_us"][key]),
            "idle": gpu_hours(figures["idle_us"][key]),
            "efficiency": figures["active_us"][key] / gpu_us if gpu_us else None,
        }
        for key, gpu_us in totals_by(lines, *dims)
    ]


def stacked_chart(lines: list[UsageLine]) -> dict:
    """A Plotly bar chart of GPU-hours per UTC day with usage, one trace per team, stacked."""
    by_day_team = dict(totals_by(lines, "day", "team"))
    days = sorted({line.day for line in lines})
    traces = [
        {
            "type": "bar",
            "name": team,
            "x": [day.isoformat() for day in days],
            "y": [gpu_hours(by_day_team.get((day, team), 0)) for day in days],
        }
        for team in sorted({line.team for line in lines})
    ]
    return {"data": traces, "layout": {"barmode": "stack"}}


def _csv(lines: list[UsageLine], month: dt.date) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="usage-{month:%Y-%m}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for line in lines:
        writer.writerow(
            (
                line.day.isoformat(),
                line.team,
                line.user,
                line.cluster,
                line.gpu_type,
                gpu_hours(line.gpu_us),
                gpu_seconds(line.gpu_us),
                gpu_hours(line.borrowed_us),
                gpu_seconds(line.active_us),
                gpu_seconds(line.idle_us),
                round(line.active_us / line.gpu_us, 4),
                amount(line.cost_micros),
                currency(),
            )
        )
    return response


def _month(text: str) -> dt.date:
    """The first day of `YYYY-MM`; the current UTC month when empty."""
    if not text:
        return timezone.now().astimezone(dt.UTC).date().replace(day=1)
    match = MONTH.fullmatch(text)
    if match and 1 <= int(match[1]) <= 9998 and 1 <= int(match[2]) <= 12:
        return dt.date(int(match[1]), int(match[2]), 1)
    raise ValueError(f"month must be YYYY-MM, e.g. 2026-11; got {text!r}")
