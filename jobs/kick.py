"""Asking the scheduler for a tick now, without waiting for beat: sent by task name, so the code
that asks (submit, resume, retry, follow-on creation) never imports the loops.

Kicks are coalesced through Redis, shared by every server process on every host: a burst of
submits asks for one tick at once and then for one trailing tick per pace, not for a tick each
(a tick reads the whole queue, so under a few hundred submits a second one per submit kept the
worker and the database busy with ticks that admitted a job each).

The window a kick coalesces over, the pace, follows what a tick costs: each tick records
PACE_PER_TICK times its own duration, from MIN_PACE_MS (a short queue: kicked ticks up to twice
a second) to MAX_PACE_MS (beat's interval: a long backlog of jobs that cannot start yet). After
the first, at most one kicked tick runs per pace (a trailing tick keeps the lead key one pace
past its own start), so under a steady stream of submits kicked ticks take at most a twentieth
of a worker's core, which the web workers beside it on a small host need. What a kick promises
holds all the same: some tick starts after it, at most the pace plus TRAIL_MARGIN_S later.
Beat's 2 s tick goes through the same window (`beat_tick_due`), so under a stream of submits
ticks run once per pace in all, not once per pace for the kicks and every 2 s for beat as well.
"""

import functools
import logging

from celery import current_app
from django.conf import settings
from redis.commands.core import Script

from jobs.redis_client import client

log = logging.getLogger(__name__)
SCHEDULE_TICK = "jobs.tasks.schedule_tick"
LEAD_KEY = "starforge:kick:schedule:lead"
TRAIL_KEY = "starforge:kick:schedule:trail"
PACE_KEY = "starforge:kick:schedule:pace"
MIN_PACE_MS = 500
MAX_PACE_MS = 2000
PACE_PER_TICK = 20
PACE_TTL_S = 60  # a pace nobody refreshed (no ticks) falls back to MIN_PACE_MS
# A trailing tick runs when the lead key would have expired, plus this: a kick that finds the
# trailing key set (it lives as long as that wait) is covered by that tick, which starts after
# it, with this to spare for the clocks of the sending and the running hosts.
TRAIL_MARGIN_S = 0.1
# One round trip: 0 send a tick now; n > 0 send one n ms from now, when the lead key would have
# expired, and keep the lead key one pace past that tick; -1 covered by the trailing tick.
COALESCE = """
local pace = tonumber(redis.call('GET', KEYS[3])) or tonumber(ARGV[1])
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', pace) then return 0 end
local left = math.max(1, redis.call('PTTL', KEYS[1]))
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', left) then
  redis.call('PEXPIRE', KEYS[1], left + pace)
  return left
end
return -1
"""


def scheduler() -> None:
    """Best effort: when the broker or Redis is down, beat's next tick admits the job all the
    same."""
    try:
        if _ask() == 0:
            current_app.send_task(SCHEDULE_TICK, retry=False)
    except Exception as exc:
        log.warning("could not kick the scheduler (%s); beat's next tick will admit the job", exc)


def beat_tick_due() -> bool:
    """Beat's tick asks through the same window as the kicks: True if it is to run now. False
    if a tick started less than a pace ago and the trailing tick that starts after this one's
    time is on its way (sent here if it was not yet): under a stream of submits, beat's ticks
    and the kicked ones would otherwise each run once per pace. Without Redis, it runs."""
    try:
        return _ask() == 0
    except Exception as exc:
        log.warning("could not coalesce beat's tick with the kicks (%s); it runs", exc)
        return True


def _ask() -> int:
    """COALESCE: 0 when a tick is to start now (the caller sends or runs it); otherwise the
    trailing tick, sent here when it was not yet, covers the caller."""
    keys = [LEAD_KEY, TRAIL_KEY, PACE_KEY]
    answer = _coalesce(settings.REDIS_URL)(keys=keys, args=[MIN_PACE_MS])
    if answer > 0:
        countdown = answer / 1000 + TRAIL_MARGIN_S
        current_app.send_task(SCHEDULE_TICK, retry=False, countdown=countdown)
    return answer


@functools.cache
def _coalesce(url: str) -> Script:
    """COALESCE on this process's client, its digest worked out once (every submit kicks)."""
    return client(url).register_script(COALESCE)


def record_tick(seconds: float) -> None:
    """A schedule tick took `seconds`: the kicks' pace from now on. Best effort, as kicks are."""
    pace = min(MAX_PACE_MS, max(MIN_PACE_MS, round(seconds * 1000 * PACE_PER_TICK)))
    try:
        client(settings.REDIS_URL).set(PACE_KEY, pace, ex=PACE_TTL_S)
    except Exception as exc:
        log.warning("could not record the scheduler's pace (%s)", exc)
