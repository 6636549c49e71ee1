"""The outbox: the webhook deliveries a change of the ledger owes, written in its transaction.

`on_transitions` runs inside the transaction that moves jobs (`jobs.ledger.transitions`) and
writes one `WebhookDelivery` per webhook and event, so a change that commits is never left
untold and one that rolls back is never told. Beat's sweep writes the waiting ones
(`notify_waiting`), a user's test the test ones, a team's budget alert its own
(`on_budget_alert`, about no job). Each is written only while the webhook's owner
may be told (`jobs.reads.webhooks.may_tell`), with a key the receiver can dedupe on (the same
change never makes two deliveries for one webhook).

After commit the delivery task is asked for by name (`enqueue`, as `jobs.kick` asks for ticks:
the ledger never imports the tasks); beat's sweep sends whatever a lost task did not
(`jobs.loops.deliveries`), so delivery is at least once.
"""

import datetime as dt
import logging
from collections.abc import Iterable

from celery import current_app
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs.models import Job, Membership, Webhook, WebhookDelivery
from jobs.reads.preemption import paused_jobs
from jobs.reads.webhooks import TEST_EVENT, may_tell
from jobs.states import JobStatus

log = logging.getLogger(__name__)
Event = Webhook.Event
FIRED_BY = {
    JobStatus.SUCCEEDED: Event.SUCCEEDED,
    JobStatus.FAILED: Event.FAILED,
    JobStatus.STOPPED: Event.STOPPED,
    JobStatus.PAUSED: Event.PREEMPTED,  # only a preemption's pause (`paused_jobs`)
}
WAITING_SCAN = 1000  # waiting jobs one sweep looks at per webhook
DELIVER_TASK = "jobs.tasks.deliver_webhooks"


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
        ids = paused_jobs(ids)  # the preemption's rule, jobs.reads.preemption
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
        allowed = may_tell([hook], {team_id for _, team_id, _ in found})
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
            if allowed(hook, team_id)
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


def on_watch(event: str, job_ids: list[int], spell: dt.datetime, now: dt.datetime) -> None:
    """The deliveries an activity watch's event owes (idle, suspected-hang), written in its
    transaction: one per webhook that asked for the event, once per idle or stalled spell
    (`spell`: when it began)."""
    jobs = list(Job.objects.filter(pk__in=job_ids).values_list("pk", "team_id", "user_id"))
    if not jobs:
        return
    hooks = [
        h
        for h in Webhook.objects.filter(
            Q(team_id__in={t for _, t, _ in jobs})
            | Q(team__isnull=True, owner_id__in={u for _, _, u in jobs})
        )
        if event in h.events
    ]
    if hooks:
        _write(hooks, event, jobs, lambda job_id: f"{job_id}-{event}-{_micros(spell)}", now)


def _write(hooks: list[Webhook], event: str, pairs: list[tuple[int, int, int]], key_of, now):
    """One delivery per webhook and (job, team, owner) it covers, its owner still allowed."""
    allowed = may_tell(hooks, {team_id for _, team_id, _ in pairs})
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
        and allowed(hook, team_id)
    ]
    if rows:
        WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
        transaction.on_commit(lambda: enqueue(None))


def on_budget_alert(team_id: int, key: str, body: dict, now: dt.datetime) -> int:
    """Called in the transaction that records a team's budget alert (`jobs.ledger.budget_alerts`):
    a delivery, about no job, carrying `body`, to each webhook that wants budget alerts (the
    team's, and its members' own) whose owner may be told about the team. Returns how many."""
    members = Membership.objects.filter(team_id=team_id).values("user_id")
    hooks = [
        h
        for h in Webhook.objects.filter(
            Q(team_id=team_id) | Q(team__isnull=True, owner_id__in=members)
        )
        if Event.BUDGET in h.events
    ]
    allowed = may_tell(hooks, {team_id})
    rows = [
        WebhookDelivery(
            webhook=hook, event=Event.BUDGET, key=key, payload=body, created_at=now, next_at=now
        )
        for hook in hooks
        if allowed(hook, team_id)
    ]
    if rows:
        WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
        transaction.on_commit(lambda: enqueue(None))
    return len(rows)


def write_test_delivery(hook: Webhook, now: dt.datetime) -> WebhookDelivery:
    """A test delivery for `hook`, about no job, sent at once (after commit) like any other."""
    delivery = WebhookDelivery.objects.create(
        webhook=hook, event=TEST_EVENT, key=f"test-{hook.pk}-{_micros(now)}", created_at=now
    )
    transaction.on_commit(lambda: enqueue([delivery.pk]))
    return delivery


def enqueue(ids: list[int] | None) -> None:
    """Ask for the delivery task (these deliveries; None: all that are due). Best effort:
    beat's sweep sends whatever a lost task did not."""
    try:
        current_app.send_task(DELIVER_TASK, args=[ids], retry=False)
    except Exception as exc:
        log.warning("could not queue webhook deliveries (%s); beat's sweep sends them", exc)


def _micros(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1_000_000)
