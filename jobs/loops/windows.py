"""Schedule windows in the scheduler tick: the windows read (`jobs.windows` parses them; a spec
that does not parse is logged and ignored), whether a job's window is closed now (the admission
rule: a job waits while its own window, else its team's, or its cluster's is closed), and the
tick's window step (`apply_window_policy`): jobs submitted with `--window-policy pause` are
paused when their window closes and queued again when it reopens.
"""

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import NamedTuple

from django.utils import timezone

from jobs.ledger.halt import halt
from jobs.ledger.transitions import Change, apply_transitions
from jobs.models import Job, ScheduleWindow, Team
from jobs.states import JobStatus
from jobs.windows import Window, WindowSpecError, parse_window

log = logging.getLogger(__name__)
S = JobStatus
RESUMED_REASON = "window opened: resumed; waiting for the scheduler"


def read_windows() -> dict[int, Window]:
    parsed = {}
    for w in ScheduleWindow.objects.all():
        try:
            parsed[w.pk] = parse_window(w.spec, w.timezone, w.name)
        except WindowSpecError:
            log.warning("schedule window %s has an invalid spec; ignoring it", w.name)
    return parsed


def closed_window(
    windows: Mapping[int, Window], now: dt.datetime, *window_ids: int | None
) -> Window | None:
    """The first of these windows that is closed now, if any."""
    for window_id in window_ids:
        window = windows.get(window_id) if window_id else None
        if window is not None and not window.is_open(now):
            return window
    return None


class WindowMoves(NamedTuple):
    """What a window step did: the jobs it paused, and those it queued again."""

    paused: list[int]
    resumed: list[int]


def apply_window_policy(
    now: dt.datetime | None = None,
    teams: Mapping[int, Team] | None = None,
    windows: Mapping[int, Window] | None = None,
) -> WindowMoves:
    """Pause `--window-policy pause` jobs whose window closed; queue them again when it opens. A
    tick passes the teams and windows it read for its gates; called alone, it reads them."""
    now = now or timezone.now()
    if teams is None:
        teams = {t.pk: t for t in Team.objects.all()}
    if windows is None:
        windows = read_windows()
    to_pause, to_resume = _due(now, teams, windows)
    paused = [
        pk
        for reason, ids in to_pause.items()
        for pk in halt(
            ids, S.PAUSED, reason, actor="scheduler", now=now, expected=S.active(), by_window=True
        ).halted
    ]
    return WindowMoves(paused, _queue_again(to_resume))


def _due(
    now: dt.datetime, teams: Mapping[int, Team], windows: Mapping[int, Window]
) -> tuple[dict[str, list[int]], list[int]]:
    """The pause-policy jobs to pause now (by reason: when their window opens again), and the
    jobs a closed window paused whose windows are all open now."""
    jobs = Job.objects.filter(window_policy=Job.WindowPolicy.PAUSE).filter(
        status__in=S.active() | {S.PAUSED}
    )
    to_pause: dict[str, list[int]] = defaultdict(list)
    to_resume: list[int] = []
    rows = jobs.values_list("pk", "status", "paused_by_window", "team_id", "window_id",
                            "cluster__window_id")  # fmt: skip
    for pk, status, by_window, team_id, window_id, cluster_window in rows:
        ids = (window_id or teams[team_id].window_id, cluster_window)
        closed = next(
            (
                windows[w]
                for w in ids
                if w is not None and w in windows and not windows[w].is_open(now)
            ),
            None,
        )
        if closed is not None and status in S.active():
            opens = closed.next_opening(now)
            to_pause[
                f"paused: window {closed.name} closed; the job resumes when it opens "
                f"({opens:%a %H:%M} {opens.tzname()})"
            ].append(pk)
        elif closed is None and status == S.PAUSED and by_window:
            to_resume.append(pk)
    return to_pause, to_resume


def _queue_again(ids: list[int]) -> list[int]:
    """Jobs the scheduler paused for a closed window back to QUEUED, their mark cleared; those
    that moved on meanwhile (a person's stop) are left as they are."""
    if not ids:
        return []
    changed, _ = apply_transitions(
        S.QUEUED, [Change(pk, RESUMED_REASON) for pk in ids], actor="scheduler", expected={S.PAUSED}
    )
    queued = [job.pk for job in changed]
    Job.objects.filter(pk__in=queued).update(paused_by_window=False)
    return queued
