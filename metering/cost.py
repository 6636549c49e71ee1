"""Cost: what GPU time cost at the prices in force when it ran, per attempt, job, user, team,
cluster, day and month. Metering alone computes it (docs/ARCHITECTURE.md, invariant 5): the
API, the console, the scheduler's money budgets, webhooks and /metrics read these figures.

An attempt's cost is the sum of its parts, cut at midnight (UTC) and where a price changes
(`metering.records.priced_day_pieces`), each part's GPU-µs at the price then
(`metering.prices`), in integer micro-units of the currency. The usage records keep the cost
of ended attempts (`UsageRecord.cost_micros`, written by `meter_ended` with the GPU-µs); every
answer adds the attempts not recorded yet, priced as it reads, the way GPU-µs are answered
(`metering.records.usage_totals`), so a team's month and a job's page agree to the micro-unit.
"""

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from django.db.models import Sum
from django.utils import timezone

from jobs.models import Attempt
from metering.models import UsageRecord
from metering.prices import PriceBook, amount, price_book, price_spans, read_prices
from metering.records import (
    KEY_COLUMNS,
    Key,
    _midnight,
    _read_consistently,
    _unrecorded_since,
    priced_day_pieces,
)

# An unrecorded attempt as cost reads it: its key's parts, its clocks, GPUs and GPU type.
PRICED_COLUMNS = (
    "pk", "job__team_id", "job__user_id", "job__cluster_id",
    "start_time", "end_time", "total_gpus", "job__gpu_type",
)  # fmt: skip


class PricedPart(NamedTuple):
    """A part of an attempt's running time billed at one price (the job page says where an
    attempt was billed at more than one)."""

    start: dt.datetime
    end: dt.datetime
    micros_per_gpu_hour: int
    cost_micros: int


def attempt_cost(
    cluster_id: int,
    gpu_type: str,
    start: dt.datetime | None,
    end: dt.datetime | None,
    total_gpus: int,
    now: dt.datetime,
    book: PriceBook | None = None,
) -> int:
    """One attempt's cost in micro-units: up to its end, or `now` while it runs."""
    schedule = (book or price_book()).schedule(cluster_id, gpu_type)
    return sum(cost for _, _, cost in priced_day_pieces(start, end, total_gpus, schedule, now))


def attempt_parts(
    cluster_id: int,
    gpu_type: str,
    start: dt.datetime | None,
    end: dt.datetime | None,
    total_gpus: int,
    now: dt.datetime,
    book: PriceBook | None = None,
) -> list[PricedPart]:
    """One attempt's running time cut where the price changed, each part with its price and
    cost (their costs sum to `attempt_cost`)."""
    stop = end or now
    if start is None or stop <= start:
        return []
    schedule = (book or price_book()).schedule(cluster_id, gpu_type)
    return [
        PricedPart(lo, hi, rate, attempt_cost(cluster_id, gpu_type, lo, hi, total_gpus, now, book))
        for lo, hi, rate in price_spans(start, stop, schedule)
    ]


def job_cost(
    cluster_id: int,
    gpu_type: str,
    started: Iterable[tuple[dt.datetime, dt.datetime | None, int]],
    now: dt.datetime,
) -> int:
    """A job's cost in micro-units: its started attempts' (start, end, GPUs in all). A job that
    never started reads no prices."""
    started = list(started)
    if not started:
        return 0
    book = price_book()
    return sum(
        attempt_cost(cluster_id, gpu_type, start, end, gpus, now, book)
        for start, end, gpus in started
    )


def usage_cost(
    since: dt.date, until: dt.date, now: dt.datetime, teams: Iterable[int]
) -> dict[Key, int]:
    """Cost in micro-units per (day, team, user, cluster, GPU type) for days in [since, until)
    of `teams`: the records' cost plus the attempts not recorded yet, priced now."""
    team_ids = sorted(set(teams))
    totals: dict[Key, int] = defaultdict(int)
    if not team_ids:
        return totals
    records = UsageRecord.objects.filter(day__gte=since, day__lt=until, team_id__in=team_ids)
    recorded, running = _read_consistently(
        lambda: list(records.values_list(*KEY_COLUMNS, "cost_micros")),
        lambda: list(
            _unrecorded_since(_midnight(since))
            .filter(job__team_id__in=team_ids)
            .values_list(*PRICED_COLUMNS)
        ),
    )
    for day, team, user, cluster, gpu_type, cost in recorded:
        totals[(day, team, user, cluster, gpu_type)] += cost
    book = read_prices()
    for team, user, cluster, start, end, gpus, gpu_type in running:
        schedule = book.schedule(cluster, gpu_type)
        for day, _, cost in priced_day_pieces(start, end, gpus, schedule, now):
            if since <= day < until:
                totals[(day, team, user, cluster, gpu_type)] += cost
    return totals


def team_cost(since: dt.date, now: dt.datetime) -> dict[int, int]:
    """Cost in micro-units per team from `since` (a UTC day) to now: the money budgets' usage
    (`jobs.loops.budgets`) and /metrics."""
    by_team = UsageRecord.objects.filter(day__gte=since).values("team_id")
    records = by_team.annotate(cost=Sum("cost_micros")).values_list("team_id", "cost")
    unrecorded = _unrecorded_since(_midnight(since)).values_list(*PRICED_COLUMNS)
    recorded, running = _read_consistently(lambda: list(records), lambda: list(unrecorded))
    totals: dict[int, int] = defaultdict(int)
    for team, cost in recorded:
        totals[team] += cost or 0
    book = read_prices()
    for team, _, cluster, start, end, gpus, gpu_type in running:
        schedule = book.schedule(cluster, gpu_type)
        for day, _, cost in priced_day_pieces(start, end, gpus, schedule, now):
            if day >= since:
                totals[team] += cost
    return totals


def month_start(now: dt.datetime) -> dt.date:
    """The first day of `now`'s UTC month: where a month's budget starts counting."""
    return now.astimezone(dt.UTC).date().replace(day=1)


def team_month_cost(now: dt.datetime | None = None) -> dict[int, int]:
    """Cost per team this UTC month, up to now."""
    now = now or timezone.now()
    return team_cost(month_start(now), now)


def attempts_of(job_id: int) -> list[tuple[int, dt.datetime | None, dt.datetime | None, int]]:
    """A job's attempts as the job page prices them: (number, start, end, GPUs in all)."""
    return list(
        Attempt.objects.filter(job_id=job_id)
        .order_by("number")
        .values_list("number", "start_time", "end_time", "total_gpus")
    )


class AttemptCost(NamedTuple):
    """An attempt's cost as a page shows it, and where it was billed at more than one price,
    the sentence that says so."""

    micros: int
    split: str


def attempt_costs(
    cluster_id: int, gpu_type: str, attempts: Iterable, now: dt.datetime
) -> list[AttemptCost]:
    """Each of `attempts` (rows with `start_time`, `end_time`, `total_gpus`) priced, in order."""
    book = price_book()
    costs = []
    for a in attempts:
        parts = attempt_parts(
            cluster_id, gpu_type, a.start_time, a.end_time, a.total_gpus, now, book
        )
        split = ""
        if len(parts) > 1:
            split = f"billed at {len(parts)} prices (the price changed while it ran): " + "; ".join(
                f"{amount(p.micros_per_gpu_hour)} per GPU-hour from {p.start:%Y-%m-%d %H:%M} UTC"
                for p in parts
            )
        costs.append(AttemptCost(sum(p.cost_micros for p in parts), split))
    return costs
