"""GPU-seconds = (end − start_time) × GPUs per attempt, from the moment the process is up.

Queued and pending time is never billed (ARCHITECTURE.md invariant 5): an attempt without a
`start_time` contributes nothing, and a running attempt accrues up to `now`.
"""

import datetime as dt
from collections.abc import Iterable

from django.utils import timezone


def attempt_gpu_seconds(
    start_time: dt.datetime | None,
    end_time: dt.datetime | None,
    gpus: int,
    now: dt.datetime | None = None,
) -> float:
    if start_time is None:
        return 0.0
    end = end_time or now or timezone.now()
    return max(0.0, (end - start_time).total_seconds()) * gpus


def job_gpu_seconds(attempts: Iterable, now: dt.datetime | None = None) -> float:
    now = now or timezone.now()
    return sum(attempt_gpu_seconds(a.start_time, a.end_time, a.gpus, now) for a in attempts)


def gpu_seconds_by_day(
    attempts: Iterable[tuple[str, str, dt.datetime | None, dt.datetime | None, int]],
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
) -> dict[tuple[dt.date, str, str], float]:
    """GPU-seconds per (UTC day, team, user) inside [start, end), an attempt split at midnight."""
    totals: dict[tuple[dt.date, str, str], float] = {}
    for team, user, began, ended, gpus in attempts:
        if began is None:
            continue  # never ran: queued and pending time is not billed
        lo, hi = max(began, start), min(ended or now, end)
        while lo < hi:
            midnight = dt.datetime.combine(lo.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
            piece_end = min(hi, midnight)
            key = (lo.date(), team, user)
            totals[key] = totals.get(key, 0.0) + (piece_end - lo).total_seconds() * gpus
            lo = piece_end
    return totals
