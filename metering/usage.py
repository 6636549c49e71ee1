"""GPU-seconds of attempts, and usage answers for people: the console page, the API, the CLI.

GPU-seconds = (end − start_time) × the attempt's GPUs in all (`total_gpus`), from the moment
the process is up. Queued and pending time is never billed (docs/ARCHITECTURE.md, invariant 5):
an attempt without a `start_time` contributes nothing, and a running attempt accrues up to
`now`. Metering alone computes them (this module, and `metering.records` in GPU-µs per day);
every other reader asks here (tests/structure/test_gpu_seconds_have_one_owner.py).

Usage answers read only `metering.records.usage_totals` (records plus the attempts not recorded
yet), restricted to the teams the caller may see, and name teams, users and clusters for display.
"""

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from typing import Literal, NamedTuple

from django.contrib.auth.models import User
from django.db.models import DurationField, ExpressionWrapper, F, QuerySet, Sum
from django.utils import timezone

from jobs.errors import NotFound
from jobs.models import Attempt, Cluster
from jobs.reads.prepared import Prepared, reader
from jobs.reads.teams import visible_teams
from metering.cost import usage_cost
from metering.records import usage_activity, usage_totals

US_PER_SECOND = 10**6
US_PER_HOUR = 3600 * US_PER_SECOND
Dimension = Literal["team", "user", "cluster", "gpu_type", "day"]


def attempt_gpu_seconds(
    start_time: dt.datetime | None,
    end_time: dt.datetime | None,
    total_gpus: int,
    now: dt.datetime | None = None,
) -> float:
    """One attempt's GPU-seconds: up to its end, or to `now` while it runs."""
    if start_time is None:
        return 0.0
    end = end_time or now or timezone.now()
    return max(0.0, (end - start_time).total_seconds()) * total_gpus


def job_gpu_seconds(attempts: Iterable, now: dt.datetime | None = None) -> float:
    """The GPU-seconds of `attempts` (rows with `start_time`, `end_time`, `total_gpus`)."""
    now = now or timezone.now()
    return sum(attempt_gpu_seconds(a.start_time, a.end_time, a.total_gpus, now) for a in attempts)


def gpu_seconds_by_team(now: dt.datetime) -> dict[str, float]:
    """Σ (end or now − start_time) × GPUs over every attempt in the ledger, per team name, in
    two queries (`/metrics`' counter: unlike the usage records, the attempts of a deleted job
    leave it).

    Closed attempts are summed in SQL per (team, GPUs), durations as a DurationField so the
    same query runs on PostgreSQL (interval) and SQLite (microseconds); only the attempts still
    running are read one by one, and there are never more of them than running jobs.
    """
    totals: dict[str, float] = defaultdict(float)
    closed = (
        Attempt.objects.filter(start_time__isnull=False, end_time__gte=F("start_time"))
        .values("job__team__name", "total_gpus")
        .annotate(
            ran=Sum(
                ExpressionWrapper(F("end_time") - F("start_time"), output_field=DurationField())
            )
        )
    )
    for row in closed:
        totals[row["job__team__name"]] += row["ran"].total_seconds() * row["total_gpus"]
    running = Attempt.objects.filter(start_time__isnull=False, end_time__isnull=True)
    for team, began, total_gpus in running.values_list(
        "job__team__name", "start_time", "total_gpus"
    ):
        totals[team] += attempt_gpu_seconds(began, None, total_gpus, now)
    return totals


class UsageLine(NamedTuple):
    """GPU-µs of one (UTC day, team, user, cluster, GPU type), with names for display (a tuple:
    the page and the API sort and sum thousands of them per request)."""

    day: dt.date
    team: str
    user: str
    cluster: str
    gpu_type: str  # the type the jobs asked for, the one their cost is priced by; "": any
    gpu_us: int
    borrowed_us: int = 0  # the part of gpu_us that ran on GPUs borrowed from another team
    cost_micros: int = 0  # what gpu_us cost at the prices in force then (metering.cost)
    active_us: int = 0  # the part of gpu_us whose GPUs worked (metering.activity)
    idle_us: int = 0  # the part whose GPUs idled; what was not reported is neither


def _team_names(shape: tuple, user_id: int = 0, name: str = "") -> QuerySet:
    staff, named = shape
    teams = visible_teams(reader(user_id, staff))
    return (teams.filter(name=name) if named else teams).values_list("pk", "name")


TEAM_NAMES = Prepared(_team_names)  # on every usage answer: its SQL is built once


def usage_teams(user: User, name: str | None = None) -> dict[int, str]:
    """Team id → name of the teams a usage answer covers: all visible ones, or the one named.

    Staff see every team; anyone else the teams they are a member of, viewers included."""
    values: dict[str, int | str] = {} if user.is_staff else {"user_id": user.pk}
    if name:
        values["name"] = name
    found = dict(TEAM_NAMES.rows((user.is_staff, bool(name)), **values))
    if name and not found:
        raise NotFound(f"team {name} does not exist or you are not in it")
    return found


def usage_lines(
    teams: dict[int, str], since: dt.date, until: dt.date, now: dt.datetime | None = None
) -> list[UsageLine]:
    """Usage of `teams` per (day, team, user, cluster, GPU type) for days in [since, until),
    sorted."""
    if not teams:
        return []
    now = now or timezone.now()
    rows, borrowed = usage_totals(since, until, now=now, teams=list(teams))
    if not any(rows.values()):
        return []
    costs = usage_cost(since, until, now, teams)
    worked = usage_activity(since, until, list(teams), now)
    users = dict(User.objects.filter(pk__in={k[2] for k in rows}).values_list("pk", "username"))
    clusters = dict(Cluster.objects.filter(pk__in={k[3] for k in rows}).values_list("pk", "name"))
    lines = []
    for key, gpu_us in rows.items():
        if not gpu_us:
            continue
        day, team, user, cluster, gpu_type = key
        # a line's activity never shows more than its GPU-time (the rest: unreported)
        on, off = worked.get(key, (0, 0))
        active = min(on, gpu_us)
        lines.append(
            UsageLine(
                day,
                teams[team],
                users[user],
                clusters[cluster],
                gpu_type,
                gpu_us,
                borrowed.get(key, 0),
                costs.get(key, 0),
                active,
                min(off, gpu_us - active),
            )
        )
    return sorted(lines)


def totals_by(
    lines: Iterable[UsageLine],
    *dimensions: Dimension,
    borrowed: bool = False,
    cost: bool = False,
    figure: str = "",
) -> list[tuple[tuple, int]]:
    """GPU-µs per value of `dimensions` (e.g. ("team", "user")), sorted by those values; with
    `borrowed`, only those on GPUs borrowed from other teams; with `cost`, what they cost in
    micro-units instead; with `figure`, that field of the lines (`active_us`, `idle_us`)."""
    figure = figure or ("cost_micros" if cost else "borrowed_us" if borrowed else "gpu_us")
    totals: dict[tuple, int] = defaultdict(int)
    for line in lines:
        totals[tuple(getattr(line, d) for d in dimensions)] += getattr(line, figure)
    return sorted(totals.items())


def gpu_seconds(gpu_us: int) -> float:
    return round(gpu_us / US_PER_SECOND, 3)


def gpu_hours(gpu_us: int) -> float:
    return round(gpu_us / US_PER_HOUR, 4)
