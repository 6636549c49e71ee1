"""The latest scheduler tick's queue plan (`jobs.loops.queueplan`), kept where every server and
worker reaches it: one Redis hash, job id -> the job's packed entry, replaced whole by each tick
that plans (a job admitted or stopped since is simply absent from the next one).

The plan is derived from the ledger, never a fact of it: when Redis is unreachable, or no tick
has planned yet, reads answer that there is no position yet, and nothing else changes. A read
asks once for all the jobs it shows (one HMGET), so a job list costs one round trip, not one
per job.

A process that wrote the plan last sends the next one as a change: the entries that differ,
the jobs that left, and the time (a long backlog's entries mostly stay as they were from one
tick to the next; rewriting 1,000 of them took 25 ms of the worker each tick). The hash holds
the version it was written at (VERSION); a change applies, in one script, only to the version
it was worked out from, and when another process (or host) wrote since, or the plan expired or
was deleted, the whole plan is written instead.
"""

import functools
import json
import logging
import secrets
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import orjson
import redis
from django.conf import settings
from redis.commands.core import Script

from jobs.redis_client import client

log = logging.getLogger(__name__)
KEY = "starforge:queue-plan"
AT = "_at"  # the field holding when the plan was made (epoch seconds)
WAITING = "_n:"  # + a cluster's id: how many jobs wait on it
VERSION = "_v"  # the field holding the random version the hash was last written at
# A plan no tick replaced for this long is dropped: reads then say there is none, rather than
# show positions from a scheduler that stopped.
TTL_S = 120
CHUNK = 2000  # fields per HSET
# Waiting jobs per cluster the plan keeps (deeper ones are counted): a tick over 100,000
# waiting jobs plans in tens of milliseconds, not seconds.
PLAN_DEPTH = 1000
Packed = bytes | str  # an entry's JSON, as Redis gives it back
# KEYS[1] the plan; ARGV: the version the change was worked out from, the new one, the TTL, the
# version's field, how many fields leave, those fields, then field/value pairs (an even count, so
# chunks of 4,000 keep pairs whole). 0: the plan is not at that version, and nothing changed.
APPLY_CHANGE = """
if redis.call('HGET', KEYS[1], ARGV[4]) ~= ARGV[1] then return 0 end
local gone = tonumber(ARGV[5])
for i = 6, 5 + gone, 4000 do  -- unpack takes a few thousand values at a time
  redis.call('HDEL', KEYS[1], unpack(ARGV, i, math.min(i + 3999, 5 + gone)))
end
for i = 6 + gone, #ARGV, 4000 do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 3999, #ARGV)))
end
redis.call('HSET', KEYS[1], ARGV[4], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


@dataclass(frozen=True)
class _Written:
    """What this process last wrote: its version ("": none, or not known to hold) and every
    field's value, and the entries they were packed from."""

    version: str = ""
    fields: dict[str, str] = dataclass_field(default_factory=dict)
    entries: dict[int, dict] = dataclass_field(default_factory=dict)


_written = _Written()


def write(entries: dict[int, dict], totals: dict[int, int], at: float) -> None:
    """Replace the plan: the kept jobs' entries and how many wait on each cluster. Never
    raises (a tick must not fail for its plan)."""
    global _written
    last = _written
    fields = {AT: repr(at), **{f"{WAITING}{c}": str(n) for c, n in totals.items()}}
    changed = [(name, value) for name, value in fields.items() if last.fields.get(name) != value]
    for job_id, entry in entries.items():
        name = str(job_id)
        if last.entries.get(job_id) == entry:  # cheaper than packing every entry again
            fields[name] = last.fields[name]
        else:
            fields[name] = json.dumps(entry, separators=(",", ":"))
            changed.append((name, fields[name]))
    gone = [name for name in last.fields if name not in fields]
    r = client(settings.REDIS_URL)
    version = secrets.token_hex(8)
    try:
        if not (last.version and _changed(last.version, version, gone, changed)):
            _replace(r, fields, version)
    except redis.RedisError as exc:
        log.warning("the queue plan was not kept (Redis): %s", exc)
        _written = _Written()
        return
    _written = _Written(version, fields, entries)


def _changed(before: str, version: str, gone: list[str], changed: list[tuple[str, str]]) -> bool:
    """Send only what changed since this process's last write (at version `before`); False:
    the plan is no longer the one it wrote."""
    args: list[str | int] = [before, version, TTL_S, VERSION, len(gone), *gone]
    args += [item for pair in changed for item in pair]
    return bool(_script(settings.REDIS_URL)(keys=[KEY], args=args))


def _replace(r: redis.Redis, fields: dict[str, str], version: str) -> None:
    staging = f"{KEY}:next:{secrets.token_hex(4)}"
    packed = list(fields.items())
    pipe = r.pipeline(transaction=False)
    pipe.hset(staging, VERSION, version)
    for i in range(0, len(packed), CHUNK):
        pipe.hset(staging, mapping=dict(packed[i : i + CHUNK]))
    pipe.expire(staging, TTL_S)
    pipe.rename(staging, KEY)
    try:
        pipe.execute()
    except redis.RedisError:
        try:
            r.delete(staging)
        except redis.RedisError:
            pass
        raise


@functools.cache
def _script(url: str) -> Script:
    return client(url).register_script(APPLY_CHANGE)


def made_at() -> float | None:
    """When the kept plan was made (epoch seconds); None: there is none, or Redis cannot be
    reached (a tick then plans, and its write says whether Redis is back)."""
    try:
        at = client(settings.REDIS_URL).hget(KEY, AT)
    except redis.RedisError:
        return None
    return float(at) if at is not None else None


def read(
    job_ids: list[int], cluster_ids: set[int]
) -> tuple[dict[int, Packed], dict[int, int], float | None]:
    """The entries of those of `job_ids` the plan keeps, packed (`unpack` reads one), how many
    wait on each of `cluster_ids`, and when the plan was made (None: there is no plan, or Redis
    cannot be reached). Packed, so that a reader can keep what it made of an entry for as long
    as the entry stays the same (`jobs.reads.queue`)."""
    if not job_ids:
        return {}, {}, None
    clusters = sorted(cluster_ids)
    fields = [AT, *(f"{WAITING}{c}" for c in clusters), *map(str, job_ids)]
    try:
        values = client(settings.REDIS_URL).hmget(KEY, fields)
    except redis.RedisError as exc:
        log.warning("the queue plan could not be read (Redis): %s", exc)
        return {}, {}, None
    at, counts, rest = values[0], values[1 : 1 + len(clusters)], values[1 + len(clusters) :]
    found = {job_id: v for job_id, v in zip(job_ids, rest, strict=True) if v}
    waiting = {c: int(n) for c, n in zip(clusters, counts, strict=True) if n is not None}
    return found, waiting, float(at) if at is not None else None


def unpack(packed: Packed) -> dict:
    """An entry as `read` gives it, as the tick planned it (JSON's lists for its tuples)."""
    # orjson: the plan holds only what a tick wrote (ints, floats, strings), nothing a job wrote.
    return orjson.loads(packed)
