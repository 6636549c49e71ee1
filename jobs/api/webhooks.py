"""The webhooks API (`/api/v1/webhooks`): a user's notifications, and their team's for team
admins. The rules are the actions' (`jobs.actions.webhooks`: scopes, events, targets allowed)
and the reads' (`jobs.reads.webhooks`: which ones a user sees)."""

import datetime as dt

from django.views.decorators.cache import never_cache
from ninja import Router, Schema, Status
from ninja.decorators import decorate_view
from pydantic import Field

from jobs.actions import webhooks as webhook_actions
from jobs.auth import ConsoleSession, UserToken
from jobs.models import Webhook, WebhookDelivery
from jobs.reads import webhooks
from jobs.schemas import ErrorOut, Text
from jobs.webhooks.send import is_slack
from jobs.webhooks.targets import URL_MAX

# Same doors as the jobs API: a token for the CLI, the session (CSRF-checked) for the console.
router = Router(auth=[UserToken(), ConsoleSession()], tags=["webhooks"])
RECENT_DELIVERIES = 50


class WebhookIn(Schema):
    url: Text = Field(..., max_length=URL_MAX, description="http(s) URL or mailto:")
    on: list[Text] = Field(
        ..., max_length=len(webhook_actions.EVENTS), description=", ".join(webhook_actions.EVENTS)
    )
    team: Text | None = Field(
        None, max_length=50, description="every job of this team (its admins only); omit: yours"
    )
    wait_after_s: int | None = Field(
        None, strict=True, description="waiting-too-long: QUEUED longer than this, 60..604800"
    )


class TryOut(Schema):
    at: str
    status: int | None
    ok: bool
    detail: str
    ms: int


class DeliveryOut(Schema):
    id: int
    key: str = Field(description="the Idempotency-Key header: the same on every try")
    event: str
    job_id: int | None
    state: str
    created_at: dt.datetime
    next_at: dt.datetime | None = Field(description="the next try, while pending")
    delivered_at: dt.datetime | None
    tries: list[TryOut]


class WebhookOut(Schema):
    id: int
    url: str
    on: list[str]
    scope: str = Field(description='"mine" (the owner\'s jobs) or "team"')
    team: str | None
    owner: str
    wait_after_s: int
    allow_private: bool = Field(description="staff let it reach private addresses")
    kind: str = Field(description="json, slack or email")
    created_at: dt.datetime


class WebhookDetailOut(WebhookOut):
    secret: str = Field(description="the HMAC-SHA256 key of the Starforge-Signature header")
    deliveries: list[DeliveryOut] = Field(description=f"the latest {RECENT_DELIVERIES}")


def webhook_out(hook: Webhook) -> dict:
    return {
        "id": hook.pk,
        "url": hook.url,
        "on": hook.events,
        "scope": "team" if hook.team_id else "mine",
        "team": hook.team.name if hook.team is not None else None,
        "owner": hook.owner.username,
        "wait_after_s": hook.wait_after_s,
        "allow_private": hook.allow_private,
        "kind": kind(hook.url),
        "created_at": hook.created_at,
    }


def kind(url: str) -> str:
    if url.lower().startswith("mailto:"):
        return "email"
    return "slack" if is_slack(url) else "json"


def delivery_out(row: WebhookDelivery) -> dict:
    return {
        "id": row.pk,
        "key": row.key,
        "event": row.event,
        "job_id": row.job_id,
        "state": row.state,
        "created_at": row.created_at,
        "next_at": row.next_at if row.state == WebhookDelivery.State.PENDING else None,
        "delivered_at": row.delivered_at,
        "tries": row.tries,
    }


def detail_out(hook: Webhook) -> dict:
    recent = hook.deliveries.order_by("-pk")[:RECENT_DELIVERIES]
    return {
        **webhook_out(hook),
        "secret": hook.secret,
        "deliveries": [delivery_out(d) for d in recent],
    }


@router.get(
    "/webhooks",
    response={200: list[WebhookOut], (401, 429): ErrorOut},
    summary="My webhooks, and those of the teams I admin",
)
def list_webhooks(request):
    return [webhook_out(h) for h in webhooks.visible_webhooks(request.auth)]


@router.post(
    "/webhooks",
    response={201: WebhookDetailOut, (400, 401, 403, 404, 422, 429): ErrorOut},
    summary="Add a webhook",
)
@decorate_view(never_cache)  # the answer holds the signing secret
def add_webhook(request, body: WebhookIn):
    hook = webhook_actions.create(request.auth, body.url, body.on, body.team, body.wait_after_s)
    return Status(201, detail_out(webhooks.get_visible_webhook(request.auth, hook.pk)))


@router.get(
    "/webhooks/{webhook_id}",
    response={200: WebhookDetailOut, (401, 404, 422, 429): ErrorOut},
    summary="One webhook with its latest deliveries and their tries",
)
@decorate_view(never_cache)  # the answer holds the signing secret
def get_webhook(request, webhook_id: int):
    return detail_out(webhooks.get_visible_webhook(request.auth, webhook_id))


@router.delete(
    "/webhooks/{webhook_id}",
    response={204: None, (401, 404, 422, 429): ErrorOut},
    summary="Remove a webhook (and its delivery log)",
)
def remove_webhook(request, webhook_id: int):
    webhook_actions.remove(request.auth, webhook_id)
    return Status(204, None)


@router.post(
    "/webhooks/{webhook_id}/test",
    response={202: DeliveryOut, (401, 404, 422, 429): ErrorOut},
    summary="Send a test delivery now",
)
def test_webhook(request, webhook_id: int):
    return Status(202, delivery_out(webhook_actions.send_test(request.auth, webhook_id)))
