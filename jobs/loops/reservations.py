"""No starvation: reservations and backfill (EASY backfill, as Slurm's backfill scheduler).

The first job of a cluster's order that finds no room (`NoRoom`) gets a reservation: the GPUs
the plan says come back first, from when they do. A job behind it that fits now starts only if
its time limit ends before then, or if the reserved job would still have its GPUs then; one
without a time limit also while the reserved job is younger than SF_RESERVE_AGE_S.

When GPUs come back is what active jobs hold until when (`active_holdings`, from the tick's
snapshot): their time limits run out, or a preempted one's grace does; this tick's admissions
hold theirs until their own limits.
"""

import bisect
import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass

from django.conf import settings

from jobs.loops.queueplan import Holding, Planned, Profile
from jobs.loops.snapshot import Queued, Snapshot


class NoRoom(Planned):
    """The cluster has not the GPUs (or nodes) free: the wait a reservation is made for."""


@dataclass
class Reservation:
    """GPUs of a cluster kept for the first job of its order that does not fit: from `start`,
    when the plan says enough come back (None: unknown, some are held by jobs without a time
    limit), for `job`."""

    job: Queued
    start: float | None
    old: bool  # waited past SF_RESERVE_AGE_S: jobs without a time limit may not pass it
    free: Profile  # the cluster's free GPUs over time, this tick's admissions in


def active_holdings(snap: Snapshot, told: Collection[int] = ()) -> list[Holding]:
    """What active GPU jobs hold, until their time limits run out (None: no limit), or for a
    preempted one (or one of the attempts `told` this tick), its grace; borrowed GPUs count
    against their lender."""
    holdings = []
    now = snap.now.timestamp()
    for job in snap.active:
        if not job.total_gpus:
            continue
        # Not started yet: counted from its admission, a time that does not move, so a
        # reservation's start does not slide later tick after tick.
        start = job.started or job.admitted
        limit = job.time_limit_s
        until = (start.timestamp() if start else now) + limit if limit else None
        preempted = snap.now if job.attempt in told else job.preempted
        if preempted is not None:
            killed = preempted.timestamp() + snap.grace_s(job.cluster)
            until = killed if until is None else min(until, killed)
        holdings.append(Holding(job.lender or job.team, job.cluster, job.total_gpus, until))
    return holdings


class Backfill:
    """One tick's reservations, one per cluster, and what its admissions hold until when."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.reservations: dict[int, Reservation] = {}
        self.admitted: list[Holding] = []
        self._held: list[Holding] | None = None  # the active jobs', worked out when first needed

    def reserve(self, job: Queued, held_gpus: int) -> None:
        """Reserve for `job`, which found no room on a cluster whose active jobs hold
        `held_gpus`, the GPUs it will have first, as the plan says; only the first such job of
        each cluster."""
        if job.cluster in self.reservations or not job.total_gpus:
            return
        capacity = self.snap.capacities[job.cluster][1]
        now = self.snap.now.timestamp()
        free = Profile(now, capacity.total_gpus - held_gpus)
        if self._held is None:
            self._held = active_holdings(self.snap)
        for held in self._held + self.admitted:
            if held.cluster == job.cluster and held.until is not None:
                free.add(max(held.until, now), held.total_gpus)
        duration = float(job.time_limit_s) if job.time_limit_s else None
        start = free.earliest(job.total_gpus, duration, now)
        waited = (self.snap.now - (job.queued_at or self.snap.now)).total_seconds()
        self.reservations[job.cluster] = Reservation(
            job, start, waited > settings.SF_RESERVE_AGE_S, free
        )

    def reserved_for_another(self, job: Queued) -> str | None:
        """Why a job that fits now must not start: it would take GPUs reserved for a job ahead
        of it, past the time they are reserved from. None: it may start (backfill)."""
        held = self.reservations.get(job.cluster)
        if held is None or not job.total_gpus:
            return None
        now = self.snap.now.timestamp()
        end = now + job.time_limit_s if job.time_limit_s else None
        if end is not None and (held.start is None or end <= held.start):
            return None  # done before the reserved job can start
        if held.start is not None and _room_left(held, job.total_gpus):
            return None  # the reserved job still has its GPUs at its start
        if end is None and not held.old:
            return None  # a young reservation: jobs without a time limit may still pass it
        cluster = self.snap.capacities[job.cluster][0].name
        when = f"from {_clock(held.start)} UTC" if held.start is not None else "as they come back"
        ahead = f"a job that waited longer ({held.job.total_gpus} GPUs)"
        if end is None:
            return NoRoom(
                f"waiting for reserved GPUs: cluster {cluster}'s GPUs are reserved {when} for "
                f"{ahead}, and a job without a time limit may not pass a job that has waited "
                f"more than {settings.SF_RESERVE_AGE_S // 60} min"
            )
        return NoRoom(
            f"waiting for reserved GPUs: cluster {cluster}'s GPUs are reserved {when} for "
            f"{ahead}; this job's time limit would run past that"
        )

    def took(self, job: Queued, lender: int | None) -> None:
        """An admission of this tick (on `lender`'s GPUs, or its own team's): it holds its GPUs
        until its time limit runs out."""
        if not job.total_gpus:
            return
        now = self.snap.now.timestamp()
        until = now + job.time_limit_s if job.time_limit_s else None
        self.admitted.append(Holding(lender or job.team, job.cluster, job.total_gpus, until))
        held = self.reservations.get(job.cluster)
        if held is not None:
            held.free.add(now, -job.total_gpus, until)


def _room_left(held: Reservation, total_gpus: int) -> bool:
    """The reserved job would still find its GPUs at its start with `total_gpus` more taken for
    good from now."""
    if held.start is None:
        return False
    free = held.free
    k = bisect.bisect_right(free.times, held.start) - 1
    return min(free.free[k:]) - total_gpus >= held.job.total_gpus


def _clock(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M")
