"""Celery tasks: thin wrappers that call the loops by primary key; safe to run twice."""

from celery import shared_task

from jobs.launcher import launch_attempts
from jobs.reconciler import reconcile_all
from jobs.scheduler import MAX_ADMIT_PER_TICK, admit_queued_jobs

LAUNCH_CHUNK = 200


@shared_task(ignore_result=True)
def schedule_tick() -> int:
    result = admit_queued_jobs()
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
    reconcile_all()
