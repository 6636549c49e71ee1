"""The usage page: GPU-hours by team, user and day, read from closed and running attempts.

A first version that sums attempts on the fly for the chosen month; the metering issue adds
usage records so it stays cheap at scale.
"""

import datetime as dt
import json
from collections import defaultdict

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone

from jobs.models import Attempt
from jobs.services import visible_jobs
from metering.usage import gpu_seconds_by_day


@login_required
def usage_page(request):
    now = timezone.now()
    month = _month(request.GET.get("month", ""), now)
    start = month
    end = (month + dt.timedelta(days=32)).replace(day=1)
    attempts = (
        Attempt.objects.filter(job__in=visible_jobs(request.user), start_time__lt=end)
        .exclude(end_time__lt=start)
        .exclude(start_time__isnull=True)
        .values_list("job__team__name", "job__user__username", "start_time", "end_time", "gpus")
    )
    rows = gpu_seconds_by_day(attempts, start, end, now)
    by_team: dict[str, float] = defaultdict(float)
    by_user: dict[tuple[str, str], float] = defaultdict(float)
    by_day_team: dict[tuple[dt.date, str], float] = defaultdict(float)
    for (day, team, user), seconds in rows.items():
        hours = seconds / 3600
        by_team[team] += hours
        by_user[(team, user)] += hours
        by_day_team[(day, team)] += hours
    days = sorted({day for day, _ in by_day_team})
    chart = [
        {
            "type": "bar",
            "name": team,
            "x": [d.isoformat() for d in days],
            "y": [round(by_day_team.get((d, team), 0.0), 3) for d in days],
        }
        for team in sorted(by_team)
    ]
    return render(
        request,
        "metering/usage.html",
        {
            "month": month,
            "by_team": sorted(by_team.items()),
            "by_user": sorted((t, u, h) for (t, u), h in by_user.items()),
            "chart": json.dumps(chart),
        },
    )


def _month(text: str, now: dt.datetime) -> dt.datetime:
    try:
        year, month = (int(part) for part in text.split("-"))
        return dt.datetime(year, month, 1, tzinfo=dt.UTC)
    except ValueError:
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
