"""Asking the scheduler for a tick now, without waiting for beat: sent by task name, so the code
that asks (submit, resume, retry, follow-on creation) never imports the loops.

Kicks are coalesced through Redis, shared by every server process on every host: a burst of
submits asks for one tick at once and for one trailing tick shortly after, not for a tick each
(a tick reads the whole queue, so under a few hundred submits a second one per submit kept the
worker and the database busy with ticks that admitted a job each). What a kick promises holds
all the same: some tick starts after it, at most TRAIL_S later, and ticks run at most about
four times a second however fast jobs are submitted (beat adds one every 2 s).
"""

import logging

from celery import current_app
from django.conf import settings

from jobs.redis_client import client

log = logging.getLogger(__name__)
SCHEDULE_TICK = "jobs.tasks.schedule_tick"
LEAD_KEY = "starforge:kick:schedule:lead"
TRAIL_KEY = "starforge:kick:schedule:trail"
# At most one tick sent at once per LEAD_MS, and one trailing tick per TRAIL_KEY_MS. A kick that
# finds the trailing key set is covered by that tick: it was sent less than TRAIL_KEY_MS ago to
# run TRAIL_S after, so it starts after this kick, with TRAIL_S - TRAIL_KEY_MS to spare for the
# clocks of the sending and the running hosts.
LEAD_MS = 500
TRAIL_KEY_MS = 500
TRAIL_S = 0.6


def scheduler() -> None:
    """Best effort: when the broker or Redis is down, beat's next tick admits the job all the
    same."""
    try:
        redis = client(settings.REDIS_URL)
        if redis.set(LEAD_KEY, 1, nx=True, px=LEAD_MS):
            current_app.send_task(SCHEDULE_TICK, retry=False)
        elif redis.set(TRAIL_KEY, 1, nx=True, px=TRAIL_KEY_MS):
            current_app.send_task(SCHEDULE_TICK, retry=False, countdown=TRAIL_S)
    except Exception as exc:
        log.warning("could not kick the scheduler (%s); beat's next tick will admit the job", exc)
