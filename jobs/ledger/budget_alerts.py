"""A team's money-budget alerts written: each threshold it reached (`jobs.loops.budgets` decides
which), once per team, month and threshold (`BudgetAlert`'s constraint), with the webhook
deliveries it owes (`jobs.ledger.outbox.on_budget_alert`; a `mailto:` webhook is the email) in
the same transaction, so an alert is told once and never lost.
"""

import datetime as dt
from typing import NamedTuple

from django.db import IntegrityError, transaction

from jobs.ledger.outbox import on_budget_alert
from jobs.models import BudgetAlert
from metering.prices import amount, currency, shown


class Alert(NamedTuple):
    team_id: int
    team: str
    percent: int
    used_micros: int
    budget_micros: int
    month: dt.date  # its first day


def write_alerts(alerts: list[Alert], now: dt.datetime) -> list[tuple[int, int]]:
    """Record and notify each alert not recorded yet; returns (team, percent) of those
    written (one another tick recorded meanwhile is skipped)."""
    written = []
    for alert in alerts:
        try:
            with transaction.atomic():
                BudgetAlert.objects.create(
                    team_id=alert.team_id,
                    month=alert.month,
                    percent=alert.percent,
                    used_micros=alert.used_micros,
                    budget_micros=alert.budget_micros,
                    notified_at=now,
                )
                key = f"budget-{alert.team_id}-{alert.month:%Y-%m}-{alert.percent}"
                on_budget_alert(alert.team_id, key, payload(alert, key, now), now)
        except IntegrityError:
            continue  # recorded by another tick: told there
        written.append((alert.team_id, alert.percent))
    return written


def payload(alert: Alert, key: str, now: dt.datetime) -> dict:
    """What a budget alert's delivery says (fixed when written: every try sends the same)."""
    return {
        "id": key,
        "event": "budget-alert",
        "created_at": now.astimezone(dt.UTC).isoformat(),
        "job": None,
        "team": alert.team,
        "month": f"{alert.month:%Y-%m}",
        "percent": alert.percent,
        "spent": amount(alert.used_micros),
        "budget": amount(alert.budget_micros),
        "currency": currency(),
        "message": (
            f"Starforge: team {alert.team} reached {alert.percent}% of its money budget for "
            f"{alert.month:%Y-%m}: {shown(alert.used_micros)} of {shown(alert.budget_micros)} "
            "spent"
        ),
    }
