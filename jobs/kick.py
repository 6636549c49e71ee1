"""Asking the scheduler for a tick now, without waiting for beat: sent by task name, so the code
that asks (submit, resume, retry, follow-on creation) never imports the loops."""

import logging

from celery import current_app

log = logging.getLogger(__name__)
SCHEDULE_TICK = "jobs.tasks.schedule_tick"


def scheduler() -> None:
    """Best effort: when the broker is down, beat's next tick admits the job all the same."""
    try:
        current_app.send_task(SCHEDULE_TICK, retry=False)
    except Exception as exc:
        log.warning("could not kick the scheduler (%s); beat's next tick will admit the job", exc)
