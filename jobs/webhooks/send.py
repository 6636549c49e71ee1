"""One try of a delivery: what it says and how it reaches its target.

What is sent: a JSON payload (the job, its status and reason, GPU-seconds, the console link),
fixed at the first try so every retry sends the same, signed with HMAC-SHA256 over
"<timestamp>.<body>" in the `Starforge-Signature` header (`t=<unix seconds>,v1=<hex>`); a Slack
incoming-webhook URL gets Slack's `{"text": ...}` body instead; a `mailto:` target gets an email
through Django's email backend, where one is set up. The POST goes to the address
`jobs.webhooks.targets.resolve` checked; redirects are not followed.
"""

import datetime as dt
import hashlib
import hmac
import http.client
import json
import socket
import ssl
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.core import mail
from django.urls import reverse

from jobs.models import Attempt, Job, Webhook, WebhookDelivery
from jobs.reads.activity import watch_note
from jobs.webhooks.targets import Refused, resolve
from metering.usage import job_gpu_seconds

Event = Webhook.Event
SEND_TIMEOUT_S = 10
SLACK_HOSTS = ("hooks.slack.com",)
SIGNATURE_HEADER = "Starforge-Signature"
USER_AGENT = "Starforge-Webhooks/1"


def payload(delivery: WebhookDelivery, now: dt.datetime) -> dict:
    """What a delivery says, fixed at its first try so every retry sends the same."""
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
        "gpus": job.total_gpus,  # in all, as ever: a payload's fields are a contract
        "total_gpus": job.total_gpus,
        "gpus_per_node": job.gpus_per_node,
        "gpu_seconds": round(job_gpu_seconds(Attempt.objects.filter(job=job), now), 3),
        "submitted_at": _iso(job.submitted_at),
        "status_changed_at": _iso(job.status_changed_at),
        "url": console_url(job.pk),
    }
    note = watch_note(job.pk, delivery.event)
    if note is not None:  # idle, suspected-hang: the watch's sentence and the ranks' stacks
        body["activity"] = note
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
        Event.IDLE: "is idle",
        Event.HUNG: "is suspected hung",
    }.get(body["event"], f"is {job['status']}")
    hours = job["gpu_seconds"] / 3600
    reason = (job["reason"].splitlines() or [job["status"]])[0].removesuffix("; last lines:")
    note = body.get("activity")
    if isinstance(note, dict) and isinstance(note.get("reason"), str):
        reason = note["reason"]  # the watch's own sentence: why it is idle or hung
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


def _iso(moment: dt.datetime | None) -> str | None:
    return moment.astimezone(dt.UTC).isoformat() if moment else None
