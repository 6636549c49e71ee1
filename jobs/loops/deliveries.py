"""The delivery loop: sends the outbox's due webhook deliveries, and tries again with backoff.

The Celery task `deliver_webhooks` runs `deliver_due` after the commit that wrote deliveries
(`jobs.ledger.outbox`) and from beat every 10 s, which sends what is due again: retries, and
deliveries whose task was lost. Deliveries are claimed with a lease, so two workers do not send
one at once; each try asks again whether the owner may still be told
(`jobs.reads.webhooks.refusal`) and goes to the address the target rule checked
(`jobs.webhooks.targets`). A delivery is retried with exponential backoff for a day; every try
is kept in its log. Running it twice sends nothing twice that one run delivered.
"""

import datetime as dt
import http.client
import time

from django.core import mail
from django.db import transaction
from django.utils import timezone

from jobs.models import WebhookDelivery
from jobs.reads.webhooks import refusal
from jobs.webhooks.send import payload, send
from jobs.webhooks.targets import Refused

RETRY_FOR = dt.timedelta(days=1)
FIRST_RETRY_S, MAX_BACKOFF_S = 15, 3600
CLAIM = 4  # deliveries claimed at once: their tries take at most CLAIM * SEND_TIMEOUT_S or so
LEASE_S = 60  # a claimed delivery is not picked up again for this long
BATCH = 100  # deliveries one task sends
TRIES_KEPT = 60  # a day of backoff is about 35 tries


def deliver_due(ids: list[int] | None = None, now: dt.datetime | None = None) -> int:
    """Send the deliveries that are due (those of `ids` only, when given), up to BATCH. They
    are claimed CLAIM at a time, each leased for LEASE_S, longer than CLAIM tries can take, so
    two workers do not send one at once; a worker that dies mid-send leaves its claim to the
    sweep after the lease. Returns how many were sent (delivered or not)."""
    now = now or timezone.now()
    sent = 0
    while sent < BATCH:
        claimed = _claim(ids, now)
        if not claimed:
            break
        for delivery in WebhookDelivery.objects.filter(pk__in=claimed).select_related(
            "webhook__owner"
        ):
            _deliver(delivery, now)
        sent += len(claimed)
    return sent


def _claim(ids: list[int] | None, now: dt.datetime) -> list[int]:
    with transaction.atomic():
        due = WebhookDelivery.objects.select_for_update(skip_locked=True).filter(
            state=WebhookDelivery.State.PENDING, next_at__lte=now
        )
        if ids is not None:
            due = due.filter(pk__in=ids)
        claimed = list(due.order_by("next_at")[:CLAIM].values_list("pk", flat=True))
        WebhookDelivery.objects.filter(pk__in=claimed).update(
            next_at=now + dt.timedelta(seconds=LEASE_S)
        )
    return claimed


def _deliver(delivery: WebhookDelivery, now: dt.datetime) -> None:
    hook = delivery.webhook
    started = time.monotonic()
    permanent = False
    try:
        why = refusal(delivery)
        if why:  # before the payload is made: it is never written for one not told
            raise Refused(why)
        if delivery.payload is None:
            delivery.payload = payload(delivery, now)
        status, detail = send(hook, delivery)
    except Refused as exc:
        status, detail, permanent = None, f"refused: {exc}", True
    except (OSError, http.client.HTTPException, mail.BadHeaderError) as exc:
        status, detail = None, f"{type(exc).__name__}: {exc}"[:300]
    ok = status is not None and 200 <= status < 300
    delivery.tries = [
        *delivery.tries[-(TRIES_KEPT - 1) :],
        {
            "at": now.isoformat(),
            "status": status,
            "ok": ok,
            "detail": detail[:300],
            "ms": round((time.monotonic() - started) * 1000),
        },
    ]
    if ok:
        delivery.state, delivery.delivered_at = WebhookDelivery.State.DELIVERED, now
    else:
        delay = min(FIRST_RETRY_S * 2 ** (len(delivery.tries) - 1), MAX_BACKOFF_S)
        delivery.next_at = now + dt.timedelta(seconds=delay)
        if permanent or delivery.next_at > delivery.created_at + RETRY_FOR:
            delivery.state = WebhookDelivery.State.GAVE_UP
    delivery.save(update_fields=["payload", "tries", "state", "next_at", "delivered_at"])
