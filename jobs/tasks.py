"""Celery tasks: thin wrappers that call the loops by primary key; safe to run twice."""

import time

from celery import shared_task
from django.utils import timezone

from jobs import audit, kick
from jobs.ledger import outbox
from jobs.loops import tickstats
from jobs.loops.activity import watch_activity
from jobs.loops.deliveries import BATCH, deliver_due
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import MAX_ADMIT_PER_TICK, admit_queued_jobs
from jobs.stores import logstore

LAUNCH_CHUNK = 200


@shared_task(ignore_result=True)
def schedule_tick(from_beat: bool = False) -> int:
    if from_beat and not kick.beat_tick_due():
        return 0  # a tick started within the kicks' pace, and the trailing one covers this
    started = time.monotonic()
    result = admit_queued_jobs()
    took = time.monotonic() - started
    tickstats.record("schedule", took)
    kick.record_tick(took)
    for start in range(0, len(result.admitted), LAUNCH_CHUNK):
        launch.delay(result.admitted[start : start + LAUNCH_CHUNK])
    if len(result.admitted) >= MAX_ADMIT_PER_TICK:
        schedule_tick.delay()  # the tick stopped at its cap: go on without waiting for beat
    return len(result.admitted)


@shared_task(ignore_result=True)
def launch(attempt_ids: list[int]) -> None:
    launch_attempts(attempt_ids)


@shared_task(ignore_result=True)
def reconcile_tick() -> None:
    started = time.monotonic()
    reconcile_all()
    watch_activity(timezone.now())  # the idle and hang policies, on what the tick just saw
    tickstats.record("reconcile", time.monotonic() - started)


@shared_task(ignore_result=True)
def compact_log(stream_id: int) -> None:
    logstore.compact(stream_id)


@shared_task(ignore_result=True)
def compact_ended_logs() -> None:
    logstore.compact_ended(timezone.now())


@shared_task(ignore_result=True)
def deliver_webhooks(ids: list[int] | None = None) -> None:
    """Send due webhook deliveries (those of `ids`, after the commit that wrote them; all that
    are due, from beat: retries and deliveries whose task was lost)."""
    while deliver_due(ids) >= BATCH and ids is None:
        pass


@shared_task(ignore_result=True)
def notify_waiting() -> None:
    outbox.notify_waiting()
    deliver_due()


@shared_task(ignore_result=True)
def purge_audit() -> None:
    """Export the audit rows past the retention, then remove them (`jobs.audit.purge`)."""
    audit.purge()
