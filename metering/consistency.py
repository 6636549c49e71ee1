"""The usage records' consistency check (`manage.py check_usage`, and the ledger check's share).

Records must agree exactly with the attempts they came from: for every (day, team, user,
cluster), `gpu_us - deleted_gpu_us` equals the sum of `day_pieces` over the metered attempts
still in the ledger, and `borrowed_gpu_us` that sum over its attempts on borrowed GPUs (exactly
where no job of the key was deleted; never more than `gpu_us` anywhere). An ended attempt left
unmetered for long means the metering sweep is stuck.

The GPU types of a (day, team, user, cluster) are summed: records metered before they had a
type (migration 0005) hold their typed attempts' usage as typeless.
"""

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.utils import timezone

from jobs.models import Attempt, Cluster, Team
from metering.models import UsageRecord
from metering.records import day_pieces

STUCK_AFTER = dt.timedelta(minutes=10)
Where = tuple[dt.date, int, int, int]  # day, team_id, user_id, cluster_id: what is compared
MAX_LINES = 50  # per kind of violation; the rest is summed up in one line


@dataclass(frozen=True)
class UsageCheck:
    violations: list[str]  # one sentence per violation; empty when the records agree
    metered_attempts: int


def check_usage_records(now: dt.datetime | None = None) -> UsageCheck:
    """Compare every usage record with its metered attempts; list stuck, unmetered attempts."""
    now = now or timezone.now()
    expected, borrowed, metered = _metered_totals()
    records = _recorded_totals()
    recorded = {key: gpu_us - deleted for key, (gpu_us, deleted, _) in records.items()}
    lent_wrong = [
        f"{_Names([key]).where(key)}: the records say {lent} GPU-µs on borrowed GPUs "
        f"(of {gpu_us}), the metered attempts on borrowed GPUs {borrowed.get(key, 0)}"
        for key, (gpu_us, deleted, lent) in sorted(records.items())
        if lent > gpu_us or (not deleted and lent != borrowed.get(key, 0))
    ]
    wrong = sorted(
        key for key in recorded.keys() | expected.keys() if recorded.get(key, 0) != expected[key]
    )
    names = _Names(wrong)
    lines = [
        f"{names.where(key)}: the records say {recorded.get(key, 0)} GPU-µs (not counting "
        f"deleted jobs), the metered attempts {expected[key]}"
        for key in wrong[:MAX_LINES]
    ]
    lines += _more(len(wrong), "records disagree with their attempts")
    lines += lent_wrong[:MAX_LINES] + _more(len(lent_wrong), "borrowed totals disagree")
    return UsageCheck(lines + _stuck_attempts(now), metered)


def usage_violations(now: dt.datetime | None = None) -> list[str]:
    """The check's violations alone, for callers that only report them."""
    return check_usage_records(now).violations


def _recorded_totals() -> dict[Where, tuple[int, int, int]]:
    """The records' GPU-µs, deleted part and borrowed part per key, GPU types summed."""
    totals: dict[Where, list[int]] = defaultdict(lambda: [0, 0, 0])
    rows = UsageRecord.objects.values_list(
        "day", "team_id", "user_id", "cluster_id", "gpu_us", "deleted_gpu_us", "borrowed_gpu_us"
    )
    for day, team, user, cluster, *figures in rows.iterator(chunk_size=5000):
        summed = totals[(day, team, user, cluster)]
        for index, value in enumerate(figures):
            summed[index] += value
    return {key: (gpu_us, deleted, lent) for key, (gpu_us, deleted, lent) in totals.items()}


def _metered_totals() -> tuple[dict[Where, int], dict[Where, int], int]:
    """GPU-µs of the metered attempts per key, in all and on borrowed GPUs; their count."""
    totals: dict[Where, int] = defaultdict(int)
    borrowed: dict[Where, int] = defaultdict(int)
    count = 0
    rows = Attempt.objects.filter(metered=True).values_list(
        "job__team_id", "job__user_id", "job__cluster_id", "start_time", "end_time", "total_gpus",
        "borrowed_from_id",
    )  # fmt: skip
    for team, user, cluster, start, end, total_gpus, lender in rows.iterator(chunk_size=5000):
        count += 1
        for day, gpu_us in day_pieces(start, end, total_gpus, end):
            totals[(day, team, user, cluster)] += gpu_us
            if lender is not None:
                borrowed[(day, team, user, cluster)] += gpu_us
    return totals, borrowed, count


def _stuck_attempts(now: dt.datetime) -> list[str]:
    stuck = Attempt.objects.filter(metered=False, end_time__lt=now - STUCK_AFTER).order_by(
        "end_time", "pk"
    )
    lines = [
        f"attempt {name} (job {job_id}) ended at {end:%Y-%m-%d %H:%M:%S} UTC and is still not "
        f"metered after {STUCK_AFTER.seconds // 60} minutes: the metering sweep is stuck"
        for name, job_id, end in stuck.values_list("backend_name", "job_id", "end_time")[:MAX_LINES]
    ]
    return lines + _more(stuck.count(), "ended attempts are not metered")


def _more(total: int, what: str) -> list[str]:
    return [f"… and {total - MAX_LINES} more {what}"] if total > MAX_LINES else []


class _Names:
    """Team, user and cluster names for the keys a report mentions (ids when one is gone)."""

    def __init__(self, keys: list[Where]) -> None:
        self.teams = dict(
            Team.objects.filter(pk__in={k[1] for k in keys}).values_list("pk", "name")
        )
        self.users = dict(
            User.objects.filter(pk__in={k[2] for k in keys}).values_list("pk", "username")
        )
        self.clusters = dict(
            Cluster.objects.filter(pk__in={k[3] for k in keys}).values_list("pk", "name")
        )

    def where(self, key: Where) -> str:
        day, team, user, cluster = key
        return (
            f"{day} team {self.teams.get(team, team)} user {self.users.get(user, user)} "
            f"cluster {self.clusters.get(cluster, cluster)}"
        )
