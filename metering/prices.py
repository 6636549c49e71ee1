"""GPU prices as metering reads them: which price was in force when, and money as integers.

Money is counted in micro-units of the server's one currency (`SF_CURRENCY`, default USD):
integers, never floats, so a bill sums exactly. A price (`jobs.money.GpuPrice`) is per GPU-hour
of a GPU type on a cluster, from its `valid_from` until the next one of the same cluster and
type; a type without a price of its own, and a job that names no type, pay the cluster's default
(the price with no type). Before a cluster's first price its GPUs cost nothing.

`price_spans` cuts an attempt's running time where the price changes, so each part is billed
at the price in force when it ran (`metering.records.priced_day_pieces`).
"""

import datetime as dt
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.db.models.signals import post_delete, post_save

from jobs.models import ClusterGrant, GpuPrice

MICROS = 10**6  # micro-units per unit of the currency
US_PER_HOUR = 3600 * 10**6
PRICE_CACHE_S = 2.0  # how long a process keeps the prices it read for its pages and answers
Rate = tuple[dt.datetime, int]  # from when, micro-units per GPU-hour
Schedule = tuple[Rate, ...]  # sorted by time


def currency() -> str:
    """The one currency every figure is in (`SF_CURRENCY`, default USD)."""
    return str(settings.SF_CURRENCY)


def to_micros(amount: Decimal | int | str) -> int:
    """An amount of money (a Decimal, never a float) in micro-units, rounded half to even."""
    if isinstance(amount, float):
        raise TypeError("money is never a float")
    return int((Decimal(amount) * MICROS).to_integral_value(rounding=ROUND_HALF_EVEN))


def amount(micros: int) -> str:
    """Micro-units as the API writes money: a decimal string with two places ("12.35")."""
    cents = (Decimal(micros) / MICROS).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)
    return str(cents)


def shown(micros: int) -> str:
    """Money for a page: "12.35 USD"."""
    return f"{amount(micros)} {currency()}"


def cost_of(gpu_us: int, micros_per_gpu_hour: int) -> int:
    """What `gpu_us` GPU-microseconds cost at one price, in micro-units (rounded down)."""
    return gpu_us * micros_per_gpu_hour // US_PER_HOUR


@dataclass(frozen=True)
class PriceBook:
    """Every price of every cluster, per (cluster id, GPU type), each a sorted schedule."""

    schedules: dict[tuple[int, str], Schedule] = field(default_factory=dict)

    def schedule(self, cluster_id: int, gpu_type: str) -> Schedule:
        """The prices a job of `gpu_type` ("" none) on the cluster pays, in time order: its
        type's own from the first of them on, the cluster's default before that (and for a
        type with none)."""
        default = self.schedules.get((cluster_id, ""), ())
        own = self.schedules.get((cluster_id, gpu_type), ()) if gpu_type else ()
        if not own:
            return default
        return tuple(rate for rate in default if rate[0] < own[0][0]) + own


def read_prices() -> PriceBook:
    """The prices as the ledger holds them now (one query)."""
    schedules: dict[tuple[int, str], list[Rate]] = defaultdict(list)
    rows = GpuPrice.objects.order_by("valid_from", "pk").values_list(
        "cluster_id", "gpu_type", "valid_from", "per_gpu_hour"
    )
    for cluster_id, gpu_type, valid_from, per_gpu_hour in rows:
        schedules[(cluster_id, gpu_type)].append((valid_from, to_micros(per_gpu_hour)))
    return PriceBook({key: tuple(rates) for key, rates in schedules.items()})


_cache: dict[str, tuple[float, PriceBook]] = {}
_cache_lock = threading.Lock()


def price_book() -> PriceBook:
    """The prices for a page or an answer: read at most every PRICE_CACHE_S per process, and
    again at once after this process saved or deleted one. A new price starts now or later
    (`GpuPrice.clean`), so another process's stale copy can only miss its first seconds on a
    page; the usage records read the prices afresh (`metering.records.meter_ended`)."""
    now = time.monotonic()
    with _cache_lock:
        kept = _cache.get("book")
        if kept is not None and now - kept[0] < PRICE_CACHE_S:
            return kept[1]
    book = read_prices()
    with _cache_lock:
        _cache["book"] = (now, book)
    return book


def forget_prices(**_: object) -> None:
    with _cache_lock:
        _cache.clear()


post_save.connect(forget_prices, sender=GpuPrice, dispatch_uid="metering.prices.saved")
post_delete.connect(forget_prices, sender=GpuPrice, dispatch_uid="metering.prices.deleted")


def visible_prices(user: User) -> QuerySet[GpuPrice]:
    """The prices a user may read: staff every cluster's, anyone else those of the clusters
    their teams may use (`jobs.grants`), by cluster, type and time."""
    prices = GpuPrice.objects.select_related("cluster").order_by(
        "cluster__name", "gpu_type", "valid_from"
    )
    if user.is_staff:
        return prices
    granted = ClusterGrant.objects.filter(team__membership__user=user).values("cluster_id")
    return prices.filter(cluster_id__in=granted)


def price_out(price: GpuPrice) -> dict:
    return {
        "cluster": price.cluster.name,
        "gpu_type": price.gpu_type,
        "per_gpu_hour": format(price.per_gpu_hour.normalize(), "f"),
        "valid_from": price.valid_from,
        "currency": currency(),
    }


def price_spans(
    start: dt.datetime, stop: dt.datetime, schedule: Schedule
) -> Iterator[tuple[dt.datetime, dt.datetime, int]]:
    """[start, stop) cut where the price changes: (from, to, micro-units per GPU-hour) for
    each part; a part before the first price costs 0."""
    edges = [start, *(since for since, _ in schedule if start < since < stop), stop]
    for lo, hi in zip(edges, edges[1:], strict=False):
        if lo < hi:
            yield lo, hi, rate_at(schedule, lo)


def rate_at(schedule: Schedule, moment: dt.datetime) -> int:
    """The price in force at `moment` (0 before the first)."""
    rate = 0
    for since, micros in schedule:
        if since > moment:
            break
        rate = micros
    return rate
