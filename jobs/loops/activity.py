"""The activity watch: a public loop step, run by the reconciler's tick, that applies each
team's idle and hang policy to its RUNNING jobs.

`watch_activity(now)` reads every watched attempt in one query (`jobs.reads.activity`), decides
from the rule there, and writes through `jobs.ledger.watch`:
- idle for the team's idle_after (and not exempted by a team admin): the warning (an event and
  the `idle` notification); still idle idle_grace later: the checkpoint notice and the pause
  (or stop, the team's idle_action);
- stalled for the team's hang_after: the suspected hang with every rank's stack dump (asked of
  the runner shortly before, `jobs.api.activity`; written without them if they have not come
  `DUMP_WAIT_S` past hang_after), then the hang_action (notify, fail, stop).
Each write is claimed once per spell, so running the step twice changes nothing the second
time. One bad row never stops the step: it is logged and skipped.
"""

import datetime as dt
import logging
from dataclasses import dataclass, field

from jobs.ledger import watch
from jobs.models import AttemptActivity
from jobs.reads.activity import (
    DUMP_WAIT_S,
    Watched,
    dumps_fresh,
    hang_reported,
    idle_since,
    stalled_since,
    watched_attempts,
)

log = logging.getLogger(__name__)


@dataclass
class WatchResult:
    watched: int = 0
    warned: list[int] = field(default_factory=list)
    noticed: list[int] = field(default_factory=list)
    hung: list[int] = field(default_factory=list)


def watch_activity(now: dt.datetime) -> WatchResult:
    """Apply the idle and hang policies to every watched RUNNING job; returns what it did."""
    result = WatchResult()
    for w in watched_attempts():
        result.watched += 1
        try:
            _watch_one(w, now, result)
        except Exception:  # one bad row never stops the step
            log.exception("activity watch of job %s failed; skipped this tick", w.job_id)
    return result


def _watch_one(w: Watched, now: dt.datetime, result: WatchResult) -> None:
    if hang_due(w, now):
        if watch.report_hang(w, _dumps(w), now):
            result.hung.append(w.job_id)
        if w.hang_action != "notify":
            return  # the job is ending: no idle step on top
    step = idle_step(w, now)
    if step == "warn" and watch.warn_idle(w, now):
        result.warned.append(w.job_id)
    elif step == "notice" and watch.notice_idle(w, now):
        result.noticed.append(w.job_id)


def hang_due(w: Watched, now: dt.datetime) -> bool:
    """Stalled for hang_after, not yet reported this spell, and its dumps here (or late)."""
    if not w.hang_after_s or hang_reported(w):
        return False
    stalled = (now - stalled_since(w)).total_seconds()
    return stalled >= w.hang_after_s and (dumps_fresh(w) or stalled >= w.hang_after_s + DUMP_WAIT_S)


def idle_step(w: Watched, now: dt.datetime) -> str | None:
    """ "warn", "notice" or None: where the idle policy stands with this attempt now."""
    if not w.idle_after_s or w.exempt:
        return None
    since = idle_since(w)
    idle = (now - since).total_seconds()
    if idle < w.idle_after_s:
        return None
    warned = w.idle_warned_at is not None and w.idle_warned_at >= since
    if not warned:
        return "warn"
    noticed = w.idle_noticed_at is not None and w.idle_noticed_at >= since
    waited = (now - (w.idle_warned_at or now)).total_seconds()
    if not noticed and waited >= w.idle_grace_s:
        return "notice"
    return None


def _dumps(w: Watched) -> list:
    if not dumps_fresh(w):
        return []
    found = AttemptActivity.objects.filter(attempt_id=w.attempt_id).values_list("dumps", flat=True)
    return next(iter(found), []) or []
