"""A team's monthly budgets, in GPU-hours (`Team.gpu_hours_per_month`) and in money
(`Team.money_budget_per_month`, in the server's currency): what the team used and spent this
month, the admission rule (a used-up budget, either, keeps the team's GPU jobs queued until the
month renews, and the words say which), the tick's hard-stop step (`apply_budget_stops`: a team
that set `budget_hard_stop` has its running GPU jobs stopped once either budget is used up) and
its alert step (`notify_budget_alerts`: each threshold of the money budget told once a month,
`jobs.ledger.budget_alerts`). Usage and cost are metering's (`metering.records.team_gpu_us`,
`metering.cost.team_cost`: the records, and the attempts still running, live).
"""

import datetime as dt
from collections.abc import Mapping
from decimal import Decimal

from django.utils import timezone

from jobs.ledger.budget_alerts import Alert, write_alerts
from jobs.ledger.halt import halt
from jobs.models import BudgetAlert, Job, Team
from jobs.money import alert_percents
from jobs.states import JobStatus
from metering.cost import month_start, team_cost
from metering.prices import shown, to_micros
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


def month_cost(teams: Mapping[int, Team], now: dt.datetime) -> dict[int, int]:
    """Cost per team since the first of this month (UTC), in micro-units of the currency;
    nothing is read where no team has a money budget."""
    if not any(t.money_budget_per_month is not None for t in teams.values()):
        return {}
    return team_cost(month_start(now), now)


def money_budget_micros(team: Team) -> int:
    return to_micros(team.money_budget_per_month or 0)


def gpu_hours_used_up(team: Team, used_us: int) -> bool:
    return team.gpu_hours_per_month is not None and used_us >= budget_us(team)


def money_used_up(team: Team, used_micros: int) -> bool:
    return team.money_budget_per_month is not None and used_micros >= money_budget_micros(team)


def held_back(
    team: Team, total_gpus: int, used_us: int, now: dt.datetime, used_micros: int = 0
) -> str | None:
    """Why the team's budgets keep a job of `total_gpus` GPUs queued (None: they do not):
    GPU-hours and the money they cost are what they count, so a job without GPUs passes."""
    if not total_gpus:
        return None
    renews = (now.astimezone(dt.UTC).replace(day=1) + dt.timedelta(days=32)).replace(day=1)
    if gpu_hours_used_up(team, used_us):
        return (
            f"waiting for budget: team {team.name} used {used_us / US_PER_HOUR:.1f} of its "
            f"{team.gpu_hours_per_month} GPU-hours this month; the budget renews "
            f"{renews:%b} 1 00:00 UTC"
        )
    if money_used_up(team, used_micros):
        return (
            f"waiting for budget: team {team.name} spent {shown(used_micros)} of its money "
            f"budget of {shown(money_budget_micros(team))} this month; the budget renews "
            f"{renews:%b} 1 00:00 UTC"
        )
    return None


def _over(team: Team, used_us: int, used_micros: int) -> str | None:
    """Which budget a hard-stopping team used up, in the stop's words (None: neither)."""
    if not team.budget_hard_stop:
        return None
    if gpu_hours_used_up(team, used_us):
        return f"its monthly budget of {team.gpu_hours_per_month} GPU-hours"
    if money_used_up(team, used_micros):
        return f"its monthly money budget of {shown(money_budget_micros(team))}"
    return None


def apply_budget_stops(
    now: dt.datetime | None = None,
    teams: Mapping[int, Team] | None = None,
    month_us: Mapping[int, int] | None = None,
    month_micros: Mapping[int, int] | None = None,
) -> list[int]:
    """Stop the active GPU jobs of the teams whose budget (GPU-hours or money) is used up and
    that asked for a hard stop; returns the jobs stopped. A tick passes the teams, the usage
    and the cost it read for its gates; called alone, it reads them."""
    now = now or timezone.now()
    if teams is None:
        teams = {t.pk: t for t in Team.objects.all()}
    if month_us is None:
        month_us = month_usage(teams, now)
    if month_micros is None:
        month_micros = month_cost(teams, now)
    stopped = []
    for team in teams.values():
        which = _over(team, month_us.get(team.pk, 0), month_micros.get(team.pk, 0))
        if which is None:
            continue
        ids = list(
            Job.objects.filter(team=team, status__in=S.active(), total_gpus__gt=0).values_list(
                "pk", flat=True
            )
        )
        reason = f"stopped: team {team.name} used {which} (hard stop)"
        stopped += halt(
            ids, S.STOPPED, reason, actor="scheduler", now=now, expected=S.active()
        ).halted
    return stopped


def notify_budget_alerts(
    now: dt.datetime | None = None,
    teams: Mapping[int, Team] | None = None,
    month_micros: Mapping[int, int] | None = None,
) -> list[tuple[int, int]]:
    """Tell each team with a money budget about every alert threshold its month's cost has
    reached and it was not told of yet this month; returns (team, percent) of those told. A
    tick passes the teams and the cost it read; called alone, it reads them."""
    now = now or timezone.now()
    if teams is None:
        teams = {t.pk: t for t in Team.objects.all()}
    if month_micros is None:
        month_micros = month_cost(teams, now)
    month = month_start(now)
    reached = [
        Alert(team.pk, team.name, percent, used, budget, month)
        for team in teams.values()
        if team.money_budget_per_month is not None
        for budget, used in ((money_budget_micros(team), month_micros.get(team.pk, 0)),)
        for percent in _percents(team)
        if used * 100 >= budget * percent
    ]
    if not reached:
        return []
    told = set(
        BudgetAlert.objects.filter(
            month=month, team_id__in={a.team_id for a in reached}
        ).values_list("team_id", "percent")
    )
    return write_alerts([a for a in reached if (a.team_id, a.percent) not in told], now)


def _percents(team: Team) -> list[int]:
    """The team's thresholds; a value saved past the form's check counts as none."""
    try:
        return alert_percents(team.budget_alert_percents)
    except ValueError:
        return []
