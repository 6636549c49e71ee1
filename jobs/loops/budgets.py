"""A team's monthly GPU-hour budget (`Team.gpu_hours_per_month`): what the team used this month,
the admission rule (a used-up budget keeps the team's GPU jobs queued until the month renews),
and the tick's hard-stop step (`apply_budget_stops`: a team that set `budget_hard_stop` has its
running GPU jobs stopped once the budget is used up). Usage is metering's
(`metering.records.team_gpu_us`: the records, and the attempts still running, live).
"""

import datetime as dt
from collections.abc import Mapping
from decimal import Decimal

from django.utils import timezone

from jobs.ledger.halt import halt
from jobs.models import Job, Team
from jobs.states import JobStatus
from metering.records import team_gpu_us
from metering.usage import US_PER_HOUR

S = JobStatus


def month_usage(teams: Mapping[int, Team], now: dt.datetime) -> dict[int, int]:
    """GPU-µs per team since the first of this month (UTC); nothing is read where no team has a
    budget."""
    if not any(t.gpu_hours_per_month is not None for t in teams.values()):
        return {}
    return team_gpu_us(now.astimezone(dt.UTC).date().replace(day=1), now)


def budget_us(team: Team) -> int:
    return int(Decimal(team.gpu_hours_per_month or 0) * US_PER_HOUR)


def held_back(team: Team, total_gpus: int, used_us: int, now: dt.datetime) -> str | None:
    """Why the team's budget keeps a job of `total_gpus` GPUs queued (None: it does not): GPU-hours
    are what it counts, so a job without GPUs passes."""
    if not total_gpus or team.gpu_hours_per_month is None or used_us < budget_us(team):
        return None
    renews = (now.astimezone(dt.UTC).replace(day=1) + dt.timedelta(days=32)).replace(day=1)
    return (
        f"waiting for budget: team {team.name} used {used_us / US_PER_HOUR:.1f} of its "
        f"{team.gpu_hours_per_month} GPU-hours this month; the budget renews "
        f"{renews:%b} 1 00:00 UTC"
    )


def apply_budget_stops(
    now: dt.datetime | None = None,
    teams: Mapping[int, Team] | None = None,
    month_us: Mapping[int, int] | None = None,
) -> list[int]:
    """Stop the active GPU jobs of the teams whose budget is used up and that asked for a hard
    stop; returns the jobs stopped. A tick passes the teams and the usage it read for its gates;
    called alone, it reads them."""
    now = now or timezone.now()
    if teams is None:
        teams = {t.pk: t for t in Team.objects.all()}
    if month_us is None:
        month_us = month_usage(teams, now)
    over = [
        t
        for t in teams.values()
        if t.budget_hard_stop
        and t.gpu_hours_per_month is not None
        and month_us.get(t.pk, 0) >= budget_us(t)
    ]
    stopped = []
    for team in over:
        ids = list(
            Job.objects.filter(team=team, status__in=S.active(), total_gpus__gt=0).values_list(
                "pk", flat=True
            )
        )
        reason = (
            f"stopped: team {team.name} used its monthly budget of "
            f"{team.gpu_hours_per_month} GPU-hours (hard stop)"
        )
        stopped += halt(
            ids, S.STOPPED, reason, actor="scheduler", now=now, expected=S.active()
        ).halted
    return stopped
