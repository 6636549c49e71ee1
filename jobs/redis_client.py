"""The one Redis client of a server or worker process for the small figures and flags it keeps
beside the broker (tick stats, counters' high water, the scheduler kick's coalescing keys)."""

import functools

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

TIMEOUT_S = 0.5


@functools.cache
def client(url: str) -> redis.Redis:
    """No retries: a caller waits at most one short timeout for a Redis that is down."""
    return redis.Redis.from_url(
        url,
        socket_timeout=TIMEOUT_S,
        socket_connect_timeout=TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )
