"""What active jobs hold, as one scheduler tick counts it: GPUs and jobs per team, member, cluster
and team on cluster, and the GPUs lent between teams. Counted once per tick from the active jobs
its snapshot read (`holdings_of`, `jobs.loops.snapshot`), then kept up to date in memory as the
tick admits: the admission gates and lending (`jobs.loops.lending`) both read it.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from jobs.loops.snapshot import Active


@dataclass
class Held:
    """GPUs (in all) and jobs held by one team, member, cluster or team on a cluster."""

    total_gpus: int = 0
    jobs: int = 0


@dataclass
class Holdings:
    """What SUBMITTED+PENDING+RUNNING jobs hold: per team, member, cluster, team on cluster."""

    team: dict[int, Held] = field(default_factory=lambda: defaultdict(Held))
    member: dict[tuple[int, int], Held] = field(default_factory=lambda: defaultdict(Held))
    cluster: dict[int, Held] = field(default_factory=lambda: defaultdict(Held))
    team_cluster: dict[tuple[int, int], Held] = field(default_factory=lambda: defaultdict(Held))
    borrowed: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # by borrower
    lent: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # by lender

    def add(self, team: int, user: int, cluster: int, total_gpus: int) -> None:
        """One more job of `team`'s `user` on `cluster`, holding `total_gpus`."""
        for held in (
            self.team[team],
            self.member[(team, user)],
            self.cluster[cluster],
            self.team_cluster[(team, cluster)],
        ):
            held.total_gpus += total_gpus
            held.jobs += 1

    def lend(self, team: int, lender: int, total_gpus: int) -> None:
        """GPUs `team` holds on `lender`'s idle quota: they count against the lender's quota
        (its own jobs' room), and against `team`'s borrow cap instead of its quota."""
        self.team[team].total_gpus -= total_gpus
        self.team[lender].total_gpus += total_gpus
        self.borrowed[team] += total_gpus
        self.lent[lender] += total_gpus


def holdings_of(active: Iterable[Active]) -> Holdings:
    """What these SUBMITTED+PENDING+RUNNING jobs hold."""
    holdings = Holdings()
    for job in active:
        holdings.add(job.team, job.user, job.cluster, job.total_gpus)
        if job.lender is not None:
            holdings.lend(job.team, job.lender, job.total_gpus)
    return holdings
