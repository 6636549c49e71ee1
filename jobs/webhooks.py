"""Owns notifications: who is told what about which jobs, and how it reaches them.

A webhook (`jobs.models.Webhook`) belongs to its owner and covers either the owner's own jobs or,
set up by a team admin, every job of one team. It names the events it wants: a job SUCCEEDED,
FAILED or STOPPED, was preempted (PAUSED when its borrowed GPUs went back), or has waited QUEUED
longer than the webhook's `wait_after_s`. Only while its owner may know: an active user who
still admins the team (a team webhook) or is still in the job's team (their own jobs'), checked
when a delivery is written and again at every try, so someone removed or deactivated is told
nothing more, not even about their own jobs (`_may_tell`).

Firing is part of the ledger's write: `on_transitions` runs inside the transaction that moves
the jobs, and writes one `WebhookDelivery` per webhook and event (the outbox), so a change that
commits is never left untold and one that rolls back is never told. After commit a Celery task
(`jobs.tasks.deliver_webhooks`) sends them; beat's sweep sends what is due again (retries, and
deliveries whose task was lost), so delivery is at least once, each with an idempotency key the
receiver can dedupe on. A delivery is retried with exponential backoff for a day; every try is
kept in its log.

What is sent: a JSON payload (the job, its status and reason, GPU-seconds, the console link),
signed with HMAC-SHA256 over "<timestamp>.<body>" in the `Starforge-Signature` header
(`t=<unix seconds>,v1=<hex>`); a Slack incoming-webhook URL gets Slack's `{"text": ...}` body
instead; a `mailto:` target gets an email through Django's email backend, where one is set up.

A target is where the server's own requests go, so nobody may point one at the server's
neighbourhood (SSRF): a URL whose host resolves to an address that is not globally routable
(`ipaddress`'s `is_global`: loopback, link-local, private, multicast, reserved, the shared
address space 100.64.0.0/10 and the other special-purpose ranges; an IPv6 address by the IPv4
one it carries) is refused when it is added and again at every delivery (the connection goes to
the address that was checked, so a name that re-resolves elsewhere between check and connect
leads nowhere), unless staff allowed it (the webhook's `allow_private`, set in the Django
admin, or a network of SF_WEBHOOK_ALLOWED_NETS). Redirects are not followed.
"""

import datetime as dt
import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import secrets
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import SplitResult, urlsplit

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import User
from django.core import mail
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from jobs.errors import BadRequest, Forbidden, NotFound
from jobs.models import Attempt, Job, Membership, Team, Webhook, WebhookDelivery
from jobs.states import JobStatus

log = logging.getLogger(__name__)
Event = Webhook.Event
EVENTS = tuple(Event.values)
FIRED_BY = {
    JobStatus.SUCCEEDED: Event.SUCCEEDED,
    JobStatus.FAILED: Event.FAILED,
    JobStatus.STOPPED: Event.STOPPED,
    JobStatus.PAUSED: Event.PREEMPTED,  # only a preemption's pause (`_preempted_ids`)
}
TEST_EVENT = "test"
MAX_PER_OWNER = 20
URL_MAX = 2000
WAIT_MIN_S, WAIT_MAX_S, WAIT_DEFAULT_S = 60, 7 * 86400, 3600
RETRY_FOR = dt.timedelta(days=1)
FIRST_RETRY_S, MAX_BACKOFF_S = 15, 3600
SEND_TIMEOUT_S = 10
CLAIM = 4  # deliveries claimed at once: their tries take at most CLAIM * SEND_TIMEOUT_S or so
LEASE_S = 60  # a claimed delivery is not picked up again for this long
BATCH = 100  # deliveries one task sends
TRIES_KEPT = 60  # a day of backoff is about 35 tries
WAITING_SCAN = 1000  # waiting jobs one sweep looks at per webhook
SLACK_HOSTS = ("hooks.slack.com",)
SIGNATURE_HEADER = "Starforge-Signature"
USER_AGENT = "Starforge-Webhooks/1"
DELIVER_TASK = "jobs.tasks.deliver_webhooks"


class Refused(Exception):
    """The target may not be delivered to (not a transient failure: no retry)."""


# -- setting up ------------------------------------------------------------------------------
def visible(user: User) -> QuerySet[Webhook]:
    """Webhooks the user may see and manage: their own, and those of the teams they admin
    (every one for staff)."""
    hooks = Webhook.objects.select_related("team", "owner").order_by("pk")
    if user.is_staff:
        return hooks
    admin_of = Membership.objects.filter(user=user, role=Membership.Role.ADMIN).values("team_id")
    return hooks.filter(Q(owner=user) | Q(team_id__in=admin_of))


def get(user: User, webhook_id: int) -> Webhook:
    hook = visible(user).filter(pk=webhook_id).first()
    if hook is None:
        raise NotFound(f"webhook {webhook_id} does not exist or is not yours")
    return hook


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
    check_target(url)
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
            secret=secrets.token_hex(32),
            wait_after_s=wait,
        )


def remove(user: User, webhook_id: int) -> None:
    get(user, webhook_id).delete()


def send_test(user: User, webhook_id: int) -> WebhookDelivery:
    """A test delivery, sent at once (after commit) like any other."""
    hook = get(user, webhook_id)
    now = timezone.now()
    delivery = WebhookDelivery.objects.create(
        webhook=hook, event=TEST_EVENT, key=f"test-{hook.pk}-{_micros(now)}", created_at=now
    )
    transaction.on_commit(lambda: _enqueue([delivery.pk]))
    return delivery


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


# -- where a target may point ---------------------------------------------------------------
def check_target(url: str, allow_private: bool = False) -> None:
    """Refuse (BadRequest) a target that is not an http(s) URL or a mailto: address, or whose
    host is not one the server may reach (see the module's docstring)."""
    if len(url) > URL_MAX:
        raise BadRequest(f"the URL is {len(url)} characters long; at most {URL_MAX}")
    if url.lower().startswith("mailto:"):
        _check_email(url[len("mailto:") :])
        return
    parts = _split(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(
            f"{url[:100]!r} is not an http(s) URL or a mailto: address; "
            "give e.g. https://hooks.example.com/starforge"
        )
    if parts.username or parts.password:
        raise BadRequest("put no credentials in the URL: receivers verify the signature instead")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number 0..65535
    except ValueError:
        raise BadRequest(f"the URL's port is not a port number: {url[:100]!r}") from None
    try:
        resolve(url, allow_private)
    except Refused as exc:
        raise BadRequest(str(exc)) from None


def _split(url: str) -> SplitResult:
    """`urlsplit`, whose ValueError on a broken host ("http://[::1", "http://[zz::1]/") is a
    BadRequest here with a sentence."""
    try:
        return urlsplit(url)
    except ValueError as exc:
        raise BadRequest(
            f"{url[:100]!r} is not a well-formed URL ({exc}); an IPv6 address goes in "
            "brackets, e.g. https://[2001:db8::1]/hook"
        ) from None


def _check_email(address: str) -> None:
    try:
        validate_email(address)
    except ValidationError:
        raise BadRequest(f"{address[:100]!r} is not an email address") from None
    if not settings.SF_NOTIFY_EMAIL:
        raise BadRequest(
            "this server sends no email (no EMAIL_HOST is set up); use an http(s) webhook"
        )


def resolve(url: str, allow_private: bool = False) -> tuple[str, int, str]:
    """(address, port, host) to connect to for `url`: its host's first address, all of which
    must be allowed. Raises Refused with the reason."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as exc:  # ValueError: NUL, bad port
        raise Refused(f"host {url[:100]!r} does not resolve ({exc})") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]
    for address in addresses:
        why = _private(address)
        if why and not (allow_private or _allowed_network(address)):
            carried = _carried(address)
            shown = address if carried == address else f"{address} (that is {carried})"
            raise Refused(
                f"host {host} resolves to {shown}, a {why} address, which webhooks may not "
                "reach unless an admin allows it"
            )
    return str(addresses[0]), port, host


NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known prefix: IPv4 in the last 32 bits


def _private(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Why the server may not reach this address ("" when it may): only globally routable
    ones (`is_global`), an IPv6 address that carries an IPv4 one judged by that."""
    address = _carried(address)
    for word, flag in (
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("unspecified", address.is_unspecified),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        # Shared address space (100.64.0.0/10: carrier NAT, Tailscale, pod networks, cloud
        # metadata such as 100.100.100.200) and the other special-purpose ranges.
        ("not globally routable", not address.is_global),
    ):
        if flag:
            return word
    return ""


def _carried(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, the NAT64 prefix), where the
    packets end up; otherwise the address itself."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    inner = address.ipv4_mapped or address.sixtofour
    if inner is None and address in NAT64:
        inner = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return inner or address


def _allowed_network(address) -> bool:
    nets = settings.SF_WEBHOOK_ALLOWED_NETS
    return any(address in ipaddress.ip_network(n, strict=False) for n in nets)


# -- firing ----------------------------------------------------------------------------------
def on_transitions(target: str, jobs: Iterable[Job], now: dt.datetime) -> None:
    """Called by the ledger inside the transaction that moved `jobs` to `target`: writes the
    deliveries their webhooks ask for. One read of webhooks (none when the target tells
    nobody); more only when a webhook wants the change."""
    event = FIRED_BY.get(JobStatus(target))
    jobs = list(jobs)
    if event is None or not jobs:
        return
    ids = [j.pk for j in jobs]
    hooks = [
        h
        for h in Webhook.objects.filter(
            Q(team_id__in={j.team_id for j in jobs})
            | Q(team__isnull=True, owner_id__in=Job.objects.filter(pk__in=ids).values("user_id"))
        )
        if event in h.events
    ]
    if not hooks:
        return
    if event == Event.PREEMPTED:
        ids = sorted(_preempted_ids(ids))
    owners = dict(Job.objects.filter(pk__in=ids).values_list("pk", "user_id"))
    teams = {j.pk: j.team_id for j in jobs}
    pairs = [(job_id, teams[job_id], owners[job_id]) for job_id in ids if job_id in owners]
    _write(hooks, event, pairs, lambda job_id: f"{job_id}-{event}-{_micros(now)}", now)


def notify_waiting(now: dt.datetime | None = None) -> int:
    """Beat's sweep: a delivery for each job QUEUED longer than a webhook's wait, once per
    stay in the queue. Returns the deliveries written."""
    now = now or timezone.now()
    written = 0
    for hook in Webhook.objects.all():
        if Event.WAITING not in hook.events:
            continue
        waiting = Job.objects.filter(
            status=JobStatus.QUEUED,
            status_changed_at__lte=now - dt.timedelta(seconds=hook.wait_after_s),
            **({"team_id": hook.team_id} if hook.team_id else {"user_id": hook.owner_id}),
        ).order_by("status_changed_at")[:WAITING_SCAN]
        found = list(waiting.values_list("pk", "team_id", "status_changed_at"))
        if not found:
            continue
        may_tell = _may_tell([hook], {team_id for _, team_id, _ in found})
        rows = [
            WebhookDelivery(
                webhook=hook,
                job_id=job_id,
                event=Event.WAITING,
                key=f"{job_id}-{Event.WAITING}-{_micros(since)}",
                created_at=now,
                next_at=now,
            )
            for job_id, team_id, since in found
            if may_tell(hook, team_id)
        ]
        told = set(
            WebhookDelivery.objects.filter(webhook=hook, key__in=[r.key for r in rows]).values_list(
                "key", flat=True
            )
        )
        rows = [r for r in rows if r.key not in told]
        if rows:
            WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)  # a racing sweep
            written += len(rows)
    return written


def _preempted_ids(job_ids: list[int]) -> set[int]:
    """Jobs whose current attempt was preempted (its pause is the preemption's)."""
    return set(
        Attempt.objects.filter(
            job_id__in=job_ids, preempted_at__isnull=False, job__current_attempt=F("pk")
        ).values_list("job_id", flat=True)
    )


def _write(hooks: list[Webhook], event: str, pairs: list[tuple[int, int, int]], key_of, now):
    """One delivery per webhook and (job, team, owner) it covers, its owner still allowed."""
    may_tell = _may_tell(hooks, {team_id for _, team_id, _ in pairs})
    rows = [
        WebhookDelivery(
            webhook=hook,
            job_id=job_id,
            event=event,
            key=key_of(job_id),
            created_at=now,
            next_at=now,
        )
        for hook in hooks
        for job_id, team_id, user_id in pairs
        if (team_id == hook.team_id if hook.team_id else user_id == hook.owner_id)
        and may_tell(hook, team_id)
    ]
    if rows:
        WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
        transaction.on_commit(lambda: _enqueue(None))


def _may_tell(hooks: Iterable[Webhook], team_ids: set[int]) -> Callable[[Webhook, int], bool]:
    """Whether a webhook may still be told about a job of a team, read in two queries for
    these webhooks and teams. Its owner must be active; a team webhook's owner must still
    admin the team (or be staff), a personal one's still be in the job's team: someone who
    was removed, demoted or deactivated is told nothing more about the team's jobs, not even
    their own (whose reasons carry log lines)."""
    owners = {h.owner_id for h in hooks}
    users = {
        pk: (active, staff)
        for pk, active, staff in User.objects.filter(pk__in=owners).values_list(
            "pk", "is_active", "is_staff"
        )
    }
    roles = {
        (user_id, team_id): role
        for user_id, team_id, role in Membership.objects.filter(
            user_id__in=owners, team_id__in=team_ids
        ).values_list("user_id", "team_id", "role")
    }

    def may_tell(hook: Webhook, team_id: int) -> bool:
        active, staff = users.get(hook.owner_id, (False, False))
        role = roles.get((hook.owner_id, team_id))
        if not active:
            return False
        if hook.team_id is not None:
            return staff or role == Membership.Role.ADMIN
        return role is not None

    return may_tell


def _refusal(delivery: WebhookDelivery) -> str:
    """Why this delivery may not be sent now ("" when it may), read at every try: the owner
    may have been removed from the job's team or deactivated since it was written."""
    hook = delivery.webhook
    if delivery.job_id is None or delivery.event == TEST_EVENT:
        return "" if hook.owner.is_active else "the webhook's owner is deactivated"
    team_id = Job.objects.filter(pk=delivery.job_id).values_list("team_id", flat=True).first()
    if team_id is None or _may_tell([hook], {team_id})(hook, team_id):
        return ""  # a job deleted meanwhile: the delivery says so (job null)
    if not hook.owner.is_active:
        return "the webhook's owner is deactivated"
    if hook.team_id is not None:
        return "the webhook's owner no longer admins its team"
    return "the webhook's owner is no longer in the job's team"


def _enqueue(ids: list[int] | None) -> None:
    """Best effort: beat's sweep sends whatever a lost task did not."""
    try:  # by name, as `jobs.kick` sends ticks: the ledger never imports the tasks
        current_app.send_task(DELIVER_TASK, args=[ids], retry=False)
    except Exception as exc:
        log.warning("could not queue webhook deliveries (%s); beat's sweep sends them", exc)


# -- delivering ------------------------------------------------------------------------------
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
        refusal = _refusal(delivery)
        if refusal:  # before the payload is made: it is never written for one not told
            raise Refused(refusal)
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


def payload(delivery: WebhookDelivery, now: dt.datetime) -> dict:
    """What a delivery says, fixed at its first try so every retry sends the same."""
    from metering.usage import job_gpu_seconds

    body: dict = {
        "id": delivery.key,
        "event": delivery.event,
        "created_at": _iso(delivery.created_at),
    }
    job = (
        Job.objects.select_related("team", "user", "cluster").filter(pk=delivery.job_id).first()
        if delivery.job_id
        else None
    )
    if job is None:
        body["job"] = None
        body["message"] = "a test delivery from Starforge: this webhook works"
        return body
    body["job"] = {
        "id": job.pk,
        "name": job.name,
        "run_id": job.run_id,
        "team": job.team.name,
        "user": job.user.username,
        "cluster": job.cluster.name,
        "status": job.status,
        "reason": job.status_reason[:2000],
        "attempt": job.attempt_count,
        "gpus": job.gpus,
        "gpu_seconds": round(job_gpu_seconds(Attempt.objects.filter(job=job), now), 3),
        "submitted_at": _iso(job.submitted_at),
        "status_changed_at": _iso(job.status_changed_at),
        "url": console_url(job.pk),
    }
    return body


def console_url(job_id: int) -> str:
    return settings.SF_CONSOLE_URL.rstrip("/") + reverse("job-detail", args=[job_id])


def summary(body: dict) -> str:
    """One line for Slack and email subjects."""
    job = body.get("job")
    if not job:
        return body.get("message", "Starforge test delivery")
    what = {
        Event.WAITING: f"has waited in the queue since {job['status_changed_at'][:19]} UTC",
        Event.PREEMPTED: "was preempted",
    }.get(body["event"], f"is {job['status']}")
    hours = job["gpu_seconds"] / 3600
    reason = (job["reason"].splitlines() or [job["status"]])[0].removesuffix("; last lines:")
    return (
        f"Starforge job {job['id']} ({job['name'] or job['run_id']}, team {job['team']}) {what}"
        f": {reason} — {hours:.2f} GPU-hours. {job['url']}"
    )


def slack_text(text: str) -> str:
    """Slack reads <...> as mentions and links: a job's name or last log line (the reason)
    must not page a whole channel (`<!channel>`), so &, < and > are escaped as Slack asks."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `Starforge-Signature` header's value for `body` sent at `timestamp`."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify(secret: str, header: str, body: bytes, tolerance_s: int = 300) -> bool:
    """The receiver's check (README "Notifications"): the signature matches and is recent."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > tolerance_s:
        return False
    expected = signature(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", ""))


def is_slack(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:  # a malformed URL saved outside `create`: never Slack's
        return False
    return parts.scheme == "https" and (parts.hostname or "") in SLACK_HOSTS


def send(hook: Webhook, delivery: WebhookDelivery) -> tuple[int | None, str]:
    """One try: (HTTP status or None, a few words). Raises Refused or a network error."""
    body = delivery.payload or {}
    if hook.url.lower().startswith("mailto:"):
        if not settings.SF_NOTIFY_EMAIL:
            raise Refused("this server sends no email any more")
        line = summary(body)
        mail.send_mail(
            subject=" ".join(line.split())[:120],  # one line, whatever the job's name holds
            message=line + "\n\n" + json.dumps(body, indent=2),
            from_email=settings.DEFAULT_FROM_EMAIL,
            recipient_list=[hook.url[len("mailto:") :]],
        )
        return 250, "sent by email"
    # Keys sorted: the stored payload comes back from the database in its own key order, and
    # every try must send the same bytes.
    data = json.dumps(
        {"text": slack_text(summary(body))} if is_slack(hook.url) else body,
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature(hook.secret, timestamp, data),
        "Starforge-Event": delivery.event,
        "Idempotency-Key": delivery.key,
    }
    status, reason = _post(hook.url, data, headers, hook.allow_private)
    return status, f"HTTP {status} {reason}".strip()


def _post(url: str, data: bytes, headers: dict, allow_private: bool) -> tuple[int, str]:
    address, port, host = resolve(url, allow_private)
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = _PinnedHTTPS(host, port, address, timeout=SEND_TIMEOUT_S)
    else:
        conn = _PinnedHTTP(host, port, address, timeout=SEND_TIMEOUT_S)
    try:
        conn.request("POST", path, body=data, headers=headers)
        response = conn.getresponse()  # the status is the answer: the body is not read
        return response.status, response.reason
    finally:
        conn.close()


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the address `resolve` checked, whatever the name resolves to now."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        raw = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def _micros(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1_000_000)


def _iso(moment: dt.datetime | None) -> str | None:
    return moment.astimezone(dt.UTC).isoformat() if moment else None
