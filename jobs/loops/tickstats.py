"""Figures `/metrics` keeps in Redis: how long the loops' ticks take, and counters' high water.

The ticks run in the Celery worker and `/metrics` is served by the ASGI server, so the figures
live where both reach: one Redis hash per loop under `starforge:tick:<loop>` holding the last
tick's duration and end time, a count, a sum and cumulative histogram buckets. Redis being
unreachable never fails a tick and never fails a scrape: tick figures are left out and counters
are served as summed, without their high water.
"""

import logging
import time
from dataclasses import dataclass

import redis
from django.conf import settings

from jobs.redis_client import client

log = logging.getLogger(__name__)

KEY_PREFIX = "starforge:tick:"
HIGH_WATER_PREFIX = "starforge:metrics:high-water:"
# Upper bounds (seconds) of the histogram buckets; a tick normally takes well under a second
# and beat fires every 2 s, so the interesting range is 10 ms to a few beats.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class TickStats:
    last_seconds: float
    last_end: float  # epoch seconds
    count: int
    total_seconds: float
    buckets: dict[float, int]  # upper bound -> ticks at or under it (cumulative)


def record(loop: str, seconds: float, ended: float | None = None) -> None:
    """Add one finished tick of `loop` ("schedule", "reconcile"); never raises."""
    ended = time.time() if ended is None else ended
    pipe = client(settings.REDIS_URL).pipeline(transaction=True)
    key = KEY_PREFIX + loop
    pipe.hset(key, mapping={"last_seconds": seconds, "last_end": ended})
    pipe.hincrby(key, "count", 1)
    pipe.hincrbyfloat(key, "sum", seconds)
    for bound in BUCKETS:
        if seconds <= bound:
            pipe.hincrby(key, f"le:{bound}", 1)
    try:
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("tick stats of %s not recorded (Redis): %s", loop, exc)


def read(loops: list[str]) -> dict[str, TickStats]:
    """The stats of each loop that has recorded a tick; {} when Redis cannot be reached."""
    pipe = client(settings.REDIS_URL).pipeline(transaction=False)
    for loop in loops:
        pipe.hgetall(KEY_PREFIX + loop)
    try:
        rows = pipe.execute()
    except redis.RedisError as exc:
        log.warning("tick stats not read (Redis): %s", exc)
        return {}
    return {loop: _parse(row) for loop, row in zip(loops, rows, strict=True) if row}


def _parse(row: dict[bytes, bytes]) -> TickStats:
    fields = {k.decode(): v.decode() for k, v in row.items()}
    return TickStats(
        last_seconds=float(fields["last_seconds"]),
        last_end=float(fields["last_end"]),
        count=int(fields["count"]),
        total_seconds=float(fields["sum"]),
        buckets={b: int(fields.get(f"le:{b}", 0)) for b in BUCKETS},
    )


# Per field: keep the larger of the stored and the offered value, and return what is kept. The
# stored strings go back untouched (Lua's own number formatting would round them).
_RAISE_TO = """
local out = {}
for i = 1, #ARGV, 2 do
  local kept = redis.call('HGET', KEYS[1], ARGV[i])
  if not kept or tonumber(ARGV[i + 1]) > tonumber(kept) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    kept = ARGV[i + 1]
  end
  out[#out + 1] = kept
end
return out
"""


def high_water(counter: str, values: dict[str, float]) -> dict[str, float]:
    """`values` (by label) never below what an earlier call returned; unchanged without Redis."""
    if not values:
        return values
    args = [part for label, v in values.items() for part in (label, repr(float(v)))]
    try:
        kept = client(settings.REDIS_URL).eval(_RAISE_TO, 1, HIGH_WATER_PREFIX + counter, *args)
    except redis.RedisError as exc:
        log.warning("high water of %s not read (Redis): %s", counter, exc)
        return values
    return {label: float(v) for label, v in zip(values, kept, strict=True)}
