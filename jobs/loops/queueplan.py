"""Where each waiting job stands and when it can start: worked out once per scheduler tick from
what the tick already read, kept for the reads (`jobs.stores.queueplan`).

Position is the order the tick considered the job in (fair share between teams, then priority
and age inside a team), counted among the jobs waiting on the same cluster and among its team's
waiting jobs. The jobs ahead of it are those waiting before it on its cluster. The first
PLAN_DEPTH jobs of each cluster are kept; the rest are counted, so a job further back says how
many wait in all rather than its exact place.

The earliest start is a plan, as Slurm's backfill plans: the cluster's free GPUs and the team's
quota room are two step functions of time, running jobs give their GPUs back at their time
limits, and each waiting job, in order, takes the first window where both have room for its
GPUs for its whole time limit. So an estimate holds if the running jobs run to their limits and
nothing is submitted ahead of the job; it is an upper bound in that jobs that end early only
make it sooner. Node packing, GPU types, members' caps and shares are not planned. No estimate
is given, with a sentence, when GPUs the job needs are held by a job without a time limit
(nobody knows when they come back), or when a gate that time does not open holds it (a closed
window, a used-up budget, an unreachable cluster).
"""

import bisect
import math
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from jobs.stores.queueplan import PLAN_DEPTH

ESTIMATE_DEPTH = 200
AHEAD_SHOWN = 5  # the nearest jobs ahead a waiting job names


class Planned(str):
    """A waiting reason the plan models (the team's GPU quota, the cluster's GPUs), so it can
    say when the job starts; for any other (a closed window, a used-up budget, a member's cap,
    a share, an unreachable cluster) it gives no estimate and says why (`Waiting.blocked`)."""


@dataclass(frozen=True)
class Waiting:
    """A waiting job, in the order the tick considered it."""

    id: int
    team: int
    cluster: int
    total_gpus: int
    time_limit_s: int | None
    # Why no estimate can be given whatever the GPUs do ("" when one can be): a closed
    # window, a used-up budget, an unreachable cluster.
    blocked: str = ""


@dataclass(frozen=True)
class Holding:
    """GPUs an active job holds, until `until` (epoch seconds; None: no time limit)."""

    team: int
    cluster: int
    total_gpus: int
    until: float | None


@dataclass(frozen=True)
class Entry:
    cluster_position: int
    team_position: int
    ahead: list[tuple[int, int, int]]  # the nearest jobs ahead: (job id, team id, GPUs)
    ahead_jobs: int
    ahead_gpus: int
    estimated_start: float | None  # epoch seconds
    no_estimate: str  # why there is none ("" when there is one)

    def packed(self) -> dict:
        return {
            "c": self.cluster_position,
            "t": self.team_position,
            "a": self.ahead,
            "n": self.ahead_jobs,
            "g": self.ahead_gpus,
            "e": self.estimated_start,
            "w": self.no_estimate,
        }


class Profile:
    """Free GPUs as a step function of time: `free[k]` from `times[k]` until `times[k + 1]`
    (the last one for ever)."""

    def __init__(self, now: float, free: int) -> None:
        self.times, self.free = [now], [free]
        self.unbounded = 0  # holdings that never come back (no time limit)

    def add(self, start: float, gpus: int, until: float | None = None) -> None:
        """`gpus` more free from `start` until `until` (None: for ever); negative takes."""
        first = self._split(start)
        last = self._split(until) if until is not None else len(self.times)
        for k in range(first, last):
            self.free[k] += gpus

    def earliest(self, gpus: int, duration: float | None, after: float) -> float | None:
        """The first time from `after` at which `gpus` are free for `duration` seconds (None:
        for ever); None when that never comes in this plan."""
        times, free = self.times, self.free
        start = after
        k = max(0, bisect.bisect_right(times, start) - 1)
        while True:
            end = start + duration if duration is not None else math.inf
            m = k
            while m < len(times) and (m == k or times[m] < end):
                if free[m] < gpus:
                    if m + 1 == len(times):
                        return None
                    start, k = times[m + 1], m + 1
                    break
                m += 1
            else:
                return start

    def _split(self, at: float) -> int:
        """The index of a step starting at `at` (made if there is none)."""
        k = bisect.bisect_right(self.times, at) - 1
        if k < 0:  # before the plan's start: the plan starts now
            return 0
        if self.times[k] == at:
            return k
        self.times.insert(k + 1, at)
        self.free.insert(k + 1, self.free[k])
        return k + 1


def plan(
    waiting: list[Waiting],
    holdings: Iterable[Holding],
    capacity: dict[int, int | None],  # cluster -> GPUs in all (None: cannot be planned)
    free: dict[int, int],  # cluster -> GPUs free now
    quota_room: dict[int, int],  # team -> GPUs of quota not held now
    names: dict[int, str],  # cluster -> name, for the sentences
    now: float,
) -> tuple[dict[int, Entry], dict[int, int]]:
    """Each of the first PLAN_DEPTH waiting jobs of each cluster's entry, and how many wait on
    each cluster in all."""
    clusters = {c: Profile(now, n) for c, n in free.items()}
    teams: dict[int, Profile] = {t: Profile(now, n) for t, n in quota_room.items()}
    for held in holdings:
        for profile in (clusters.get(held.cluster), teams.get(held.team)):
            if profile is None:
                continue
            if held.until is None:
                profile.unbounded += 1
            else:
                profile.add(max(held.until, now), held.total_gpus)
    entries: dict[int, Entry] = {}
    seen: dict[int, int] = defaultdict(int)  # cluster -> waiting jobs so far
    gpus_seen: dict[int, int] = defaultdict(int)
    team_seen: dict[int, int] = defaultdict(int)
    nearest: dict[int, deque] = defaultdict(lambda: deque(maxlen=AHEAD_SHOWN))
    for job in waiting:
        c = job.cluster
        team_seen[job.team] += 1
        if seen[c] >= PLAN_DEPTH:
            seen[c] += 1  # counted, not kept
            continue
        start, why = None, job.blocked
        if not why and capacity.get(c) is None:
            why = f"cluster {names.get(c, c)} does not say how many GPUs it has"
        elif not why and seen[c] >= ESTIMATE_DEPTH:
            why = f"more than {ESTIMATE_DEPTH} jobs are ahead of it on cluster {names[c]}"
        elif not why:
            start, why = _place(job, clusters[c], teams.get(job.team), capacity[c], names[c], now)
        seen[c] += 1
        entries[job.id] = Entry(
            cluster_position=seen[c],
            team_position=team_seen[job.team],
            ahead=list(reversed(nearest[c])),
            ahead_jobs=seen[c] - 1,
            ahead_gpus=gpus_seen[c],
            estimated_start=start,
            no_estimate=why,
        )
        nearest[c].append((job.id, job.team, job.total_gpus))
        gpus_seen[c] += job.total_gpus
    return entries, dict(seen)


def _place(
    job: Waiting,
    cluster: Profile,
    team: Profile | None,
    total: int | None,
    name: str,
    now: float,
) -> tuple[float | None, str]:
    """The job's earliest start, taken from both profiles, or why there is none."""
    if job.total_gpus == 0:
        return now, ""
    if total is not None and job.total_gpus > total:
        return None, f"cluster {name} has {total} GPUs; this job needs {job.total_gpus}"
    duration = float(job.time_limit_s) if job.time_limit_s else None
    start = now
    for _ in range(100):  # each round moves `start` later; a handful suffices in practice
        on_cluster = cluster.earliest(job.total_gpus, duration, start)
        if on_cluster is None:
            return None, _never(f"cluster {name}'s GPUs", cluster, job.total_gpus)
        in_quota = team.earliest(job.total_gpus, duration, on_cluster) if team else on_cluster
        if in_quota is None:
            return None, _never("its team's quota", team, job.total_gpus)  # type: ignore[arg-type]
        if in_quota == on_cluster:
            until = on_cluster + duration if duration is not None else None
            for profile in (cluster, team):
                if profile is not None:
                    profile.add(on_cluster, -job.total_gpus, until)
                    profile.unbounded += until is None
            return on_cluster, ""
        start = in_quota
    return None, "the plan found no time when both its cluster and its team have room"


def _never(what: str, profile: Profile, total_gpus: int) -> str:
    held = profile.unbounded
    if not held:
        return f"{what} never have room for its {total_gpus} GPUs"
    return (
        f"{what} it needs are held by {held} running or earlier job{'s' if held != 1 else ''} "
        "without a time limit, so when they come back is unknown"
    )
