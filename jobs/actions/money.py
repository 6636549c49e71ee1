"""Staff's money verbs: a new GPU price (from a moment on: a price is never edited, so the past
keeps the prices it was billed at) and a team's money budget and alert thresholds. Like the
quotas, they are staff's alone: anyone else gets the 403 and its sentence, and nothing is
written. The Django admin writes the same rows (`jobs.admin`); `/api/v1/prices` and
`/api/v1/teams/NAME/budget` (`metering.api`) come through here.
"""

import datetime as dt
import logging
from decimal import Decimal, InvalidOperation

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.errors import BadRequest, Conflict, Forbidden
from jobs.grants import any_cluster
from jobs.models import GpuPrice, Team
from jobs.money import PAST_SLACK, alert_percents
from jobs.reads.teams import get_team

log = logging.getLogger(__name__)
MAX_PRICE = Decimal("100000000")  # per GPU-hour: past it, a typo
MAX_BUDGET = Decimal("1000000000000")


def add_price(
    actor: User, cluster_name: str, gpu_type: str, per_gpu_hour: str, valid_from: dt.datetime | None
) -> GpuPrice:
    """A new price of `gpu_type` ("" the cluster's default) on the cluster from `valid_from`
    (default now), which may not lie in the past."""
    _staff_only(actor, "set GPU prices")
    price = _amount("per_gpu_hour", per_gpu_hour, MAX_PRICE, places=6)
    now = timezone.now()
    start = valid_from or now
    if start.tzinfo is None:
        raise BadRequest("valid_from needs a time zone, e.g. 2026-12-01T00:00:00Z")
    if start < now - PAST_SLACK:
        raise BadRequest(
            "valid_from lies in the past: a new price starts now or later, so what already ran "
            "keeps the price it was billed at"
        )
    cluster = any_cluster(cluster_name)
    try:
        with transaction.atomic():
            made = GpuPrice.objects.create(
                cluster=cluster, gpu_type=gpu_type, per_gpu_hour=price, valid_from=start
            )
    except IntegrityError:
        raise Conflict(
            f"cluster {cluster.name} already has a {gpu_type or 'default'} price from {start}"
        ) from None
    log.info("GPU price %s set by %s", made, actor.username)
    return made


def set_money_budget(actor: User, team_name: str, changes: dict) -> Team:
    """Set the team's money budget (None: none), its alert thresholds and its hard stop. A team
    the actor is not in is not found (404) before a member is refused (403)."""
    get_team(actor, team_name)
    _staff_only(actor, "set budgets")
    values: dict = {}
    if "money_budget_per_month" in changes:
        given = changes["money_budget_per_month"]
        values["money_budget_per_month"] = (
            None if given is None else _amount("money_budget_per_month", given, MAX_BUDGET, 2)
        )
    if changes.get("budget_alert_percents") is not None:
        text = changes["budget_alert_percents"]
        try:
            values["budget_alert_percents"] = ",".join(map(str, alert_percents(text)))
        except ValueError as exc:
            raise BadRequest(f"budget_alert_percents: {exc}") from None
    if changes.get("budget_hard_stop") is not None:
        values["budget_hard_stop"] = bool(changes["budget_hard_stop"])
    with transaction.atomic():
        team = get_team(actor, team_name)
        Team.objects.filter(pk=team.pk).update(**values)
    log.info("team %s money budget set by %s: %s", team.name, actor.username, values)
    return get_team(actor, team_name)


def _staff_only(actor: User, what: str) -> None:
    if not actor.is_staff:
        raise Forbidden(f"only staff {what}; ask your Starforge administrator")


def _amount(field: str, text: object, limit: Decimal, places: int) -> Decimal:
    """A money amount given as a decimal string (or an integer), never a float."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise BadRequest(f'{field} must be a decimal string, e.g. "2.50"')
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        raise BadRequest(
            f'{field} must be a decimal string, e.g. "2.50"; got {str(text)[:20]!r}'
        ) from None
    if not value.is_finite() or value < 0 or value > limit:
        raise BadRequest(f"{field} must be from 0 to {limit}")
    if value != value.quantize(Decimal(1).scaleb(-places)):
        raise BadRequest(f"{field} has at most {places} decimal places")
    return value
