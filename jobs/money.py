"""The ledger's money rows: GPU prices (`GpuPrice`, dated, per cluster and GPU type) and the
budget alerts a team was sent (`BudgetAlert`, one per team, month and threshold), with the
check of a team's alert thresholds (`alert_percents`).

A price is never edited: a change is a new row from its `valid_from` on, so every attempt keeps
the price in force when it ran (`metering.cost` bills it). `jobs.models` imports these so that
the app and every reader find them there; this module names the ledger's models by label.
"""

import datetime as dt

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

# A team's alert thresholds: at most this many, each a whole percent of its money budget.
MAX_ALERTS = 10
MAX_ALERT_PERCENT = 1000
PAST_SLACK = dt.timedelta(minutes=5)  # a new price from a form filled in a few minutes ago


def alert_percents(text: str) -> list[int]:
    """The thresholds of `budget_alert_percents` ("50,80,100"), sorted, each once; raises
    ValueError with a sentence for anything else."""
    parts = [p.strip().removesuffix("%").strip() for p in text.split(",") if p.strip()]
    if len(parts) > MAX_ALERTS:
        raise ValueError(f"at most {MAX_ALERTS} alert thresholds, e.g. 50,80,100")
    found = set()
    for part in parts:
        if not part.isascii() or not part.isdigit() or not 1 <= int(part) <= MAX_ALERT_PERCENT:
            raise ValueError(
                f"alert thresholds are whole percents from 1 to {MAX_ALERT_PERCENT}, "
                f"separated by commas (e.g. 50,80,100); got {part[:20]!r}"
            )
        found.add(int(part))
    return sorted(found)


def validate_alert_percents(text: str) -> None:
    try:
        alert_percents(text)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc


class GpuPrice(models.Model):
    """What one GPU of a type costs per hour on a cluster, from `valid_from` until the next
    price of the same cluster and type. An empty type is the cluster's default: jobs that name
    no GPU type, and types with no price of their own."""

    cluster = models.ForeignKey("jobs.Cluster", on_delete=models.CASCADE, related_name="prices")
    gpu_type = models.CharField(
        max_length=64, blank=True, help_text="e.g. H100; empty: the cluster's default price"
    )
    per_gpu_hour = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        validators=[MinValueValidator(0)],
        help_text="price of one GPU for one hour, in the server's currency (SF_CURRENCY)",
    )
    valid_from = models.DateTimeField(
        default=timezone.now, help_text="in force from this moment until the next price"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "gpu_type", "valid_from"], name="one_price_per_moment"
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.cluster_id}/{self.gpu_type or 'default'}: {self.per_gpu_hour} per GPU-hour "
            f"from {self.valid_from:%Y-%m-%d %H:%M} UTC"
        )

    def clean(self) -> None:
        """A new price starts now or later: what already ran keeps the price it was billed at."""
        if self._state.adding and self.valid_from < timezone.now() - PAST_SLACK:
            raise ValidationError(
                {"valid_from": "a new price starts now or later: the past keeps its prices"}
            )


class BudgetAlert(models.Model):
    """A team was told it reached `percent` of its money budget in `month` (its first day):
    written once, in the transaction that writes the notifications, so each threshold is told
    once a month (`jobs.ledger.budget_alerts`)."""

    team = models.ForeignKey("jobs.Team", on_delete=models.CASCADE, related_name="+")
    month = models.DateField()
    percent = models.PositiveIntegerField()
    used_micros = models.BigIntegerField(help_text="the month's cost when it was reached")
    budget_micros = models.BigIntegerField()
    notified_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "month", "percent"], name="one_alert_per_threshold"
            ),
        ]

    def __str__(self) -> str:
        return f"team {self.team_id} reached {self.percent}% in {self.month:%Y-%m}"
