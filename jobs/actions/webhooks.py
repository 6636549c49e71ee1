"""The webhook verbs a person uses: add one, remove one, send a test delivery.

API, console and CLI all come through here. A webhook covers its owner's own jobs or, added by
one of its admins, every job of a team; it names the events it wants (`EVENTS`) and points where
the server may reach (`jobs.webhooks.targets`, checked before anything is written). Which ones a
user may see and manage is `jobs.reads.webhooks.visible_webhooks`.
"""

import secrets
from collections.abc import Sequence

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from jobs.errors import BadRequest, Forbidden, NotFound
from jobs.ledger import outbox
from jobs.models import Membership, Team, Webhook, WebhookDelivery
from jobs.reads.webhooks import get_visible_webhook
from jobs.webhooks.targets import check_target

EVENTS = tuple(Webhook.Event.values)
MAX_PER_OWNER = 20
WAIT_MIN_S, WAIT_MAX_S, WAIT_DEFAULT_S = 60, 7 * 86400, 3600


def create(
    user: User,
    url: str,
    events: Sequence[str],
    team_name: str | None = None,
    wait_after_s: int | None = None,
) -> Webhook:
    """Add a webhook; every refusal is a BadRequest (or Forbidden) with its sentence, and
    nothing is written."""
    url = (url or "").strip()
    chosen = _events(events)
    wait = WAIT_DEFAULT_S if wait_after_s is None else wait_after_s
    if not WAIT_MIN_S <= wait <= WAIT_MAX_S:
        raise BadRequest(
            f"wait_after_s must be {WAIT_MIN_S} to {WAIT_MAX_S} seconds (1 min to 7 days), "
            f"not {wait}"
        )
    team = _team_for(user, team_name) if team_name else None
    check_target(url)  # resolves the host: before the transaction, which holds a row lock
    with transaction.atomic():
        User.objects.select_for_update().filter(pk=user.pk).first()  # counts one at a time
        if Webhook.objects.filter(owner=user).count() >= MAX_PER_OWNER:
            raise BadRequest(
                f"you have {MAX_PER_OWNER} webhooks, the most one person may have; remove one"
            )
        return Webhook.objects.create(
            owner=user,
            team=team,
            url=url,
            events=chosen,
            secret=new_secret(),
            wait_after_s=wait,
        )


def remove(user: User, webhook_id: int) -> None:
    with transaction.atomic():
        get_visible_webhook(user, webhook_id).delete()


def send_test(user: User, webhook_id: int) -> WebhookDelivery:
    """A test delivery, sent at once (after commit) like any other."""
    with transaction.atomic():
        return outbox.write_test_delivery(get_visible_webhook(user, webhook_id), timezone.now())


def new_secret() -> str:
    """A webhook's signing key (the HMAC-SHA256 key of its `Starforge-Signature` header)."""
    return secrets.token_hex(32)


def _events(events: Sequence[str]) -> list[str]:
    if isinstance(events, str):
        events = [e for e in events.split(",") if e.strip()]
    chosen = [str(e).strip() for e in events or ()]
    unknown = [e for e in chosen if e not in EVENTS]
    if unknown or not chosen:
        what = f"unknown event {unknown[0]!r}" if unknown else "no event given"
        raise BadRequest(f"{what}: say which of {', '.join(EVENTS)} to be told about")
    return sorted(set(chosen), key=EVENTS.index)


def _team_for(user: User, name: str) -> Team:
    team = Team.objects.filter(name=name).first()
    role = (
        Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()
        if team
        else None
    )
    if team is None or (role is None and not user.is_staff):
        raise NotFound(f"team {name} does not exist or you are not in it")
    if role != Membership.Role.ADMIN and not user.is_staff:
        raise Forbidden(
            f"only team {name}'s admins may add a webhook for all its jobs; "
            "leave the team out to be told about your own jobs"
        )
    return team
