"""What active jobs hold, as one scheduler tick counts it: GPUs and jobs per team, member, cluster
and team on cluster, and the GPUs lent between teams. Read once per tick in one grouped query
(`read_holdings`), then kept up to date in memory as the tick admits: the admission gates and
lending (`jobs.loops.lending`) both read it.
"""

from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Count, Sum

from jobs.models import Job
from jobs.states import JobStatus


@dataclass
class Held:
    """GPUs and jobs held by one team, member, cluster or team on a cluster."""

    gpus: int = 0
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

    def add(self, team: int, user: int, cluster: int, gpus: int, jobs: int = 1) -> None:
        for held in (
            self.team[team],
            self.member[(team, user)],
            self.cluster[cluster],
            self.team_cluster[(team, cluster)],
        ):
            held.gpus += gpus
            held.jobs += jobs

    def lend(self, team: int, lender: int, gpus: int) -> None:
        """GPUs `team` holds on `lender`'s idle quota: they count against the lender's quota
        (its own jobs' room), and against `team`'s borrow cap instead of its quota."""
        self.team[team].gpus -= gpus
        self.team[lender].gpus += gpus
        self.borrowed[team] += gpus
        self.lent[lender] += gpus


def read_holdings() -> Holdings:
    """What SUBMITTED+PENDING+RUNNING jobs hold now, in one grouped query."""
    holdings = Holdings()
    rows = (
        Job.objects.filter(status__in=JobStatus.active())
        .values("team_id", "user_id", "cluster_id", "current_attempt__borrowed_from")
        .annotate(gpus=Sum("gpus"), jobs=Count("id"))
    )
    for row in rows:
        team, gpus = row["team_id"], row["gpus"] or 0
        holdings.add(team, row["user_id"], row["cluster_id"], gpus, row["jobs"])
        if row["current_attempt__borrowed_from"] is not None:
            holdings.lend(team, row["current_attempt__borrowed_from"], gpus)
    return holdings
