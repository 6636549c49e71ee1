"""Fair share between teams: the order a scheduler tick offers the queue in.

The queue is offered team by team. A team's score is its GPU-hours over the last
`FAIR_SHARE_DAYS` days plus the GPUs it holds now (each counted as an hour), divided by its GPU
quota; the team with the lowest score places its next job (highest priority, then oldest), its
score grows by that job's GPUs / quota (`charged`), and the offer goes to the lowest score again.
Priority therefore orders jobs only within a team.
"""

import datetime as dt
import heapq
from collections.abc import Mapping

from jobs.models import Team
from metering.records import team_gpu_us
from metering.usage import US_PER_HOUR

FAIR_SHARE_DAYS = 7


def recent_usage(now: dt.datetime) -> dict[int, int]:
    """GPU-µs per team over the last FAIR_SHARE_DAYS days, the running attempts' included."""
    return team_gpu_us(now.date() - dt.timedelta(days=FAIR_SHARE_DAYS), now)


def order(
    team_ids: list[int],
    recent_us: Mapping[int, int],
    held_gpus: Mapping[int, int],
    teams: Mapping[int, Team],
) -> list[tuple[float, int]]:
    """A heap of (score, team): recent GPU-µs (in GPU-hours) plus the GPUs each team holds now,
    per GPU of quota. One team alone needs no score."""
    if len(team_ids) < 2:
        return [(0.0, t) for t in team_ids]
    heap = [
        ((recent_us.get(t, 0) / US_PER_HOUR + held_gpus[t]) / max(teams[t].gpu_quota, 1), t)
        for t in team_ids
    ]
    heapq.heapify(heap)
    return heap


def charged(score: float, total_gpus: int, team: Team) -> float:
    """A team's score once it placed a job of `total_gpus` GPUs."""
    return score + total_gpus / max(team.gpu_quota, 1)
