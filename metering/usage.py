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
