"""The console's Notifications page: a user's webhooks and those of the teams they admin, with
each one's latest deliveries and every try of them (the delivery log).

Adding, testing and removing are CSRF-protected forms that call the same actions as the API
(`jobs.actions.webhooks`); a refusal comes back as a message on the page.
"""

from collections import defaultdict
from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.http import HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from jobs.actions import webhooks as webhook_actions
from jobs.api.webhooks import kind
from jobs.console import refusals
from jobs.errors import BadRequest
from jobs.models import Membership, Team, Webhook, WebhookDelivery
from jobs.reads import webhooks
from jobs.webhooks.send import SIGNATURE_HEADER
from jobs.webhooks.targets import URL_MAX

RECENT_DELIVERIES = 20
Event = Webhook.Event
EVENT_HELP: dict[str, str] = {
    Event.SUCCEEDED: "a job succeeded",
    Event.FAILED: "a job failed",
    Event.STOPPED: "a job was stopped",
    Event.PREEMPTED: "a job was preempted (paused when its borrowed GPUs went back)",
    Event.WAITING: "a job has waited in the queue longer than the time below",
}
CHECKED_BY_DEFAULT = (Event.SUCCEEDED, Event.FAILED)


@never_cache  # it shows each webhook's signing secret
@login_required
def notification_list(request):
    return _page(request)


def _page(request, form: QueryDict | None = None, status: int = 200) -> HttpResponse:
    """The page; with `form`, its add form filled in as it was sent (a refused add)."""
    hooks = list(webhooks.visible_webhooks(request.user))
    recent = latest_deliveries([h.pk for h in hooks])
    rows = [{"hook": h, "kind": kind(h.url), "deliveries": recent.get(h.pk, [])} for h in hooks]
    chosen = form.getlist("on") if form is not None else CHECKED_BY_DEFAULT
    return render(
        request,
        "jobs/notifications.html",
        {
            "rows": rows,
            "events": [
                {"name": e, "help": EVENT_HELP.get(e, ""), "checked": e in chosen}
                for e in webhook_actions.EVENTS
            ],
            "form": form or {},
            "scopes": scopes(request.user),
            "wait_default_min": webhook_actions.WAIT_DEFAULT_S // 60,
            "wait_min_min": webhook_actions.WAIT_MIN_S // 60,
            "wait_max_min": webhook_actions.WAIT_MAX_S // 60,
            "url_max": URL_MAX,
            "recent": RECENT_DELIVERIES,
            "signature_header": SIGNATURE_HEADER,
        },
        status=status,
    )


def latest_deliveries(webhook_ids: list[int]) -> dict[int, list[WebhookDelivery]]:
    """The latest RECENT_DELIVERIES deliveries of each webhook, newest first, in one query (a
    row number per webhook), without their payloads."""
    if not webhook_ids:
        return {}
    rows = (
        WebhookDelivery.objects.filter(webhook_id__in=webhook_ids)
        .defer("payload")
        .annotate(rank=Window(RowNumber(), partition_by=[F("webhook_id")], order_by=F("pk").desc()))
        .filter(rank__lte=RECENT_DELIVERIES)
        .order_by("webhook_id", "-pk")
    )
    grouped: dict[int, list[WebhookDelivery]] = defaultdict(list)
    for row in rows:
        grouped[row.webhook_id].append(row)
    return grouped


def scopes(user) -> list[str]:
    """Team names the user may add a team webhook for: those they admin (every team for staff).
    The form's other choice, "my jobs", is the empty value."""
    if user.is_staff:
        return list(Team.objects.order_by("name").values_list("name", flat=True))
    return list(
        Membership.objects.filter(user=user, role=Membership.Role.ADMIN)
        .order_by("team__name")
        .values_list("team__name", flat=True)
    )


@never_cache  # a refused add answers the page, secrets and all
@login_required
@require_POST
def notification_add(request):
    url = request.POST.get("url", "").strip()
    team_name = request.POST.get("team", "").strip() or None

    def add() -> str:
        hook = webhook_actions.create(
            request.user,
            url,
            request.POST.getlist("on"),
            team_name,
            _wait_s(request.POST.get("wait_after_min", "")),
        )
        return f"webhook {hook.pk} added: {', '.join(hook.events)} to {url}"

    # A refused add answers the page itself, with the refusal's 4xx (a malformed URL: 400, as
    # the API), the sentence, and the form as it was filled in.
    return refusals.act(
        request, add, reverse("notifications"), lambda status: _page(request, request.POST, status)
    )


@login_required
@require_POST
def notification_test(request, webhook_id: int):
    def test() -> str:
        delivery = webhook_actions.send_test(request.user, webhook_id)
        return (
            f"test delivery {delivery.pk} to webhook {webhook_id} queued; "
            "its tries show in the log below"
        )

    return _act(request, test)


@login_required
@require_POST
def notification_remove(request, webhook_id: int):
    def remove() -> str:
        webhook_actions.remove(request.user, webhook_id)
        return f"webhook {webhook_id} and its delivery log removed"

    return _act(request, remove)


def _wait_s(text: str) -> int | None:
    """The form's minutes as seconds; empty: the default. The action checks the range."""
    text = text.strip()
    if not text:
        return None
    if not text.isdigit():
        raise BadRequest(f"waiting longer than must be a whole number of minutes, not {text!r}")
    return int(text) * 60


def _act(request, action: Callable[[], str]) -> HttpResponse:
    return refusals.act(request, action, reverse("notifications"))
