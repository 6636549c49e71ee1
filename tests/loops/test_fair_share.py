"""`jobs.loops.fairshare`: the order a tick offers the queue in, from plain figures."""

import heapq

from jobs.loops import fairshare
from tests.loops.plain import team

HOUR_US = 3600 * 10**6
TEAMS = {1: team(1, "vision", quota=4), 2: team(2, "nlp", quota=2)}


def offered(heap: list[tuple[float, int]]) -> list[int]:
    return [team for _, team in sorted(heap)]


def test_recent_gpu_hours_and_gpus_held_now_count_per_gpu_of_quota():
    heap = fairshare.order([1, 2], {1: 8 * HOUR_US}, {1: 0, 2: 1}, TEAMS)
    assert sorted(heap) == [(0.5, 2), (2.0, 1)]  # nlp: 1 GPU held / 2; vision: 8 h / 4
    heapq.heappop(heap)
    assert offered(heap) == [1]


def test_one_team_alone_needs_no_score():
    assert fairshare.order([1], {1: 8 * HOUR_US}, {1: 3}, TEAMS) == [(0.0, 1)]


def test_a_placed_job_grows_its_teams_score_by_its_gpus_per_gpu_of_quota():
    assert fairshare.charged(0.5, 2, TEAMS[1]) == 1.0
    assert fairshare.charged(0.0, 3, team(3, "free", quota=0)) == 3.0  # no quota: per GPU
