"""One tick's admission, decided from its snapshot: the queue offered in fair-share order
(`jobs.loops.fairshare`), each job through the gates (`jobs.loops.gates`) and past the
reservations (`jobs.loops.reservations`), what each admission takes counted for the rest of the
tick (`jobs.loops.tally`). It reads and writes nothing: `jobs.loops.scheduler` writes what it
decided (`Decided`).
"""

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass, field

from jobs.loops import fairshare, queueplan
from jobs.loops.gates import gate
from jobs.loops.placement import kept_off
from jobs.loops.queueplan import Planned
from jobs.loops.reservations import NoRoom
from jobs.loops.snapshot import Queued, Snapshot
from jobs.loops.tally import Tally

# An admission to write: job, GPUs, the lending team (None: its own quota), its event's data.
Admission = tuple[int, int, int | None, dict]


@dataclass
class Decided:
    """What a tick decided, to be written: admissions, new waiting reasons, the waiting jobs in
    the order considered (the queue plan's order), and whether it considered every job; with
    the snapshot it decided from and what it took (lending's notices among it)."""

    snap: Snapshot
    tally: Tally
    admit: list[Admission] = field(default_factory=list)
    reasons: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    waiting: list[queueplan.Waiting] = field(default_factory=list)
    considered_all: bool = True

    def wait(self, job: Queued, reason: str) -> None:
        """The job waits: its reason written where it changed, its place kept for the plan."""
        if reason != job.old_reason:
            self.reasons[reason].append(job.id)
        blocked = "" if isinstance(reason, Planned) else reason
        self.waiting.append(
            queueplan.Waiting(
                job.id, job.team, job.cluster, job.total_gpus, job.time_limit_s, blocked
            )
        )


def decide(snap: Snapshot, limit: int) -> Decided:
    """Offer the queue in fair-share order through the gates, admitting at most `limit` jobs
    (past it, the next tick goes on)."""
    tally = Tally.start(snap)
    decided = Decided(snap, tally)
    queue = {team: deque(jobs) for team, jobs in snap.queue.items()}
    held = {team: tally.held.team[team].total_gpus for team in queue}
    turn = fairshare.order(list(queue), snap.recent_us, held, snap.teams)
    while turn:
        score, team_id = heapq.heappop(turn)
        job = queue[team_id].popleft()
        reason, placed = _verdict(snap, tally, job)
        if reason is None:
            if len(decided.admit) >= limit:
                decided.considered_all = False  # the next tick plans the queue
                break
            lender = tally.take(job, placed)
            record = admission_record(snap, tally, job, lender)
            decided.admit.append((job.id, job.total_gpus, lender, record))
            score = fairshare.charged(score, job.total_gpus, snap.teams[team_id])
        else:
            decided.wait(job, reason)
        if queue[team_id]:
            heapq.heappush(turn, (score, team_id))
    return decided


def _verdict(snap: Snapshot, tally: Tally, job: Queued) -> tuple[str | None, list[str] | None]:
    """The gates' verdict on a job, and the reservations': the first job of a cluster that
    finds no room gets one; a job that fits may not take GPUs reserved for another."""
    reason, placed = gate(snap, tally, job)
    if reason is None:
        reason = tally.backfill.reserved_for_another(job)
    elif isinstance(reason, NoRoom):
        tally.backfill.reserve(job, tally.held.cluster[job.cluster].total_gpus)
    return reason, placed


def admission_record(snap: Snapshot, tally: Tally, job: Queued, lender: int | None) -> dict:
    """What the team held with this job and the quotas it was admitted under, kept in the
    admission event so `check_ledger` can verify every admission after the fact; for a job on
    borrowed GPUs, the borrowed sum and the cap. Only the job's own team's figures: every
    member of it reads the event, so the lender (which the attempt keeps) and its holdings and
    quota stay out (docs/ARCHITECTURE.md, invariant 8). For a job whose attempts hung before,
    the nodes its attempt is kept off, and those it is not (`node_avoidance`)."""
    team = snap.teams[job.team]
    held, member = tally.held.team[team.pk], tally.held.member[(team.pk, job.user)]
    borrowed = {}
    if lender is not None:
        borrowed = {
            "borrowed": True,
            "borrowed_gpus": tally.held.borrowed[team.pk],
            "borrow_cap": team.borrow_cap,
        }
    return {
        **borrowed,
        "team_gpus": held.total_gpus,
        "team_jobs": held.jobs,
        "member_gpus": member.total_gpus,
        "gpu_quota": team.gpu_quota,
        "max_jobs": team.max_jobs,
        "user_gpu_cap": team.user_gpu_cap,
        **node_avoidance(snap, job),
    }


def node_avoidance(snap: Snapshot, job: Queued) -> dict:
    """Where a job's hung attempts ran: the nodes its new attempt is kept off (`kept_off`) and
    those of the cluster's nodes it is not, since without them too few would be left for it."""
    capacity = snap.capacities[job.cluster][1]
    if not job.avoid_nodes or not capacity.nodes:
        return {}
    off = kept_off(capacity, job)
    usable = {n.name for n in capacity.nodes}
    return {
        "kept_off": sorted(off),
        "not_kept_off": [n for n in job.avoid_nodes if n in usable and n not in off],
    }
