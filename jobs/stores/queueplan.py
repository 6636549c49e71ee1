"""The last scheduler tick's queue plan (`jobs.loops.queueplan`), kept where every server and
worker reaches it: one Redis hash, job id -> the job's packed entry, replaced whole by each tick
that plans (a job admitted or stopped since is simply absent from the next one).

The plan is derived from the ledger, never a fact of it: when Redis is unreachable, or no tick
has planned yet, reads answer that there is no position yet, and nothing else changes. A read
asks once for all the jobs it shows (one HMGET), so a job list costs one round trip, not one
per job.
"""

import json
import logging
import secrets

import redis
from django.conf import settings

from jobs.redis_client import client

log = logging.getLogger(__name__)
KEY = "starforge:queue-plan"
AT = "_at"  # the field holding when the plan was made (epoch seconds)
WAITING = "_n:"  # + a cluster's id: how many jobs wait on it
# A plan no tick replaced for this long is dropped: reads then say there is none, rather than
# show positions from a scheduler that stopped.
TTL_S = 120
CHUNK = 2000  # fields per HSET
# Waiting jobs per cluster the plan keeps (deeper ones are counted): a tick over 100,000
# waiting jobs plans in tens of milliseconds, not seconds.
PLAN_DEPTH = 1000


def write(entries: dict[int, dict], totals: dict[int, int], at: float) -> None:
    """Replace the plan: the kept jobs' entries and how many wait on each cluster. Never
    raises (a tick must not fail for its plan)."""
    r = client(settings.REDIS_URL)
    staging = f"{KEY}:next:{secrets.token_hex(4)}"
    packed = [
        (str(job_id), json.dumps(entry, separators=(",", ":"))) for job_id, entry in entries.items()
    ]
    pipe = r.pipeline(transaction=False)
    pipe.hset(staging, mapping={AT: at, **{f"{WAITING}{c}": n for c, n in totals.items()}})
    for i in range(0, len(packed), CHUNK):
        pipe.hset(staging, mapping=dict(packed[i : i + CHUNK]))
    pipe.expire(staging, TTL_S)
    pipe.rename(staging, KEY)
    try:
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("the queue plan was not kept (Redis): %s", exc)
        try:
            r.delete(staging)
        except redis.RedisError:
            pass


def read(
    job_ids: list[int], cluster_ids: set[int]
) -> tuple[dict[int, dict], dict[int, int], float | None]:
    """The entries of those of `job_ids` the plan keeps, how many wait on each of
    `cluster_ids`, and when the plan was made (None: there is no plan, or Redis cannot be
    reached)."""
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
    found = {job_id: json.loads(v) for job_id, v in zip(job_ids, rest, strict=True) if v}
    waiting = {c: int(n) for c, n in zip(clusters, counts, strict=True) if n is not None}
    return found, waiting, float(at) if at is not None else None
