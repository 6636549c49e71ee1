"""What one scheduler tick has taken so far, on top of what its snapshot read: the holdings per
team, member and cluster (`jobs.loops.holdings`), lending's state (`jobs.loops.lending`), the
nodes and capped GPU types (`jobs.loops.placement`), the reservations and this tick's admissions
(`jobs.loops.reservations`), and the running tasks of each capped array. Each starts from the
snapshot and grows as the tick admits; nothing here reads the database.
"""

from dataclasses import dataclass

from jobs.loops.holdings import Holdings, holdings_of
from jobs.loops.lending import Lending
from jobs.loops.placement import Placement
from jobs.loops.reservations import Backfill
from jobs.loops.snapshot import Queued, Snapshot


@dataclass
class Tally:
    """What one tick has taken so far (the module says of what)."""

    held: Holdings
    lending: Lending
    placement: Placement
    backfill: Backfill
    array_tasks: dict[int, int]  # active tasks per array a queued task's --max-parallel caps

    @classmethod
    def start(cls, snap: Snapshot) -> "Tally":
        lending = Lending(snap.now, snap.teams, snap.grace_s, set(snap.capacities))
        # Teams with a GPU job of their own waiting lend nothing this tick.
        lending.wanting = {
            team for team, jobs in snap.queue.items() if any(j.total_gpus for j in jobs)
        }
        return cls(
            held=holdings_of(snap.active),
            lending=lending,
            placement=Placement(snap),
            backfill=Backfill(snap),
            array_tasks=dict(snap.array_tasks),
        )

    def take(self, job: Queued, placed: list[str] | None) -> int | None:
        """Count an admission of this tick (its ranks on `placed`, where the cluster reports
        its nodes) in everything the rest of the tick gates on; returns the team it borrows
        from (None: it runs on its own team's quota)."""
        lender = self.lending.borrowing.get(job.id)
        self.placement.hold(job, placed)
        self.backfill.took(job, lender)
        if job.array_cap is not None and job.array is not None:
            self.array_tasks[job.array] = self.array_tasks.get(job.array, 0) + 1
        self.held.add(job.team, job.user, job.cluster, job.total_gpus)
        if lender is not None:
            self.held.lend(job.team, lender, job.total_gpus)
        return lender
