"""Live updates for console pages: payloads built where events are written, sent after commit.

Groups: ``job-<id>`` gets a job's log batches and status changes (the job page); ``jobs`` gets
every status change with the job's team, several to a message (list pages; the list consumer
forwards only the user's teams); ``user-<id>`` hears that the user's memberships, the user or
one of their sessions changed (`jobs.signals`), so their open pages check again what they may see.

The channel layer is lossy by design (a full channel drops messages), so a log batch carries
its attempt, its sequence numbers and the log cursor just after it: a page that sees a batch
not continuing the last line it shows fetches the missing range from the logs API.

Publishing never breaks a write: it runs after commit, is bounded by a timeout, and a failure
is logged and dropped (pages recover through the API). One commit can change thousands of jobs
(a scheduler tick), so a publish costs a fixed number of Redis round trips for the groups nobody
listens to, and the jobs group gets one message per `STATUS_BATCH` changes, not one per job.
A metrics nudge ("refresh these charts") is not even waited for: a job logging through MLflow
sends a hundred batches a second, and each would otherwise wait on Redis (`POSTED_LIMIT`).
"""

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Coroutine, Iterable
from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import BaseChannelLayer, get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.db import transaction

log = logging.getLogger(__name__)

JOBS_GROUP = "jobs"
SEND_TIMEOUT_S = 2.0
# Metrics nudges posted and not sent yet, per process: past this (Redis stuck) new ones are
# dropped, as a full channel drops them; the charts catch up through the API.
POSTED_LIMIT = 100
STATUS_BATCH = 500  # status changes per message to the jobs group


def job_group(job_id: int) -> str:
    return f"job-{job_id}"


def user_group(user_id: int) -> str:
    return f"user-{user_id}"


def lines_message(attempt: int, lines: list[dict], cursor: str) -> dict:
    """One appended batch (sorted, contiguous seqs) as the job page receives it; a line of a
    multi-node job carries its rank, as stored, so the page can pick one rank's lines."""
    return {
        "type": "job.lines",
        "attempt": attempt,
        "first_seq": lines[0]["seq"],
        "cursor": cursor,
        "lines": [
            {
                "seq": line["seq"],
                **({"rank": line["rank"]} if "rank" in line else {}),
                "stream": line["stream"],
                "ts": line["ts"],
                # As stored: the log file replaces a lone surrogate with "?" (and so must a
                # pushed line, or the page would differ from the download).
                "text": line["text"].encode(errors="replace").decode(),
            }
            for line in lines
        ],
    }


def status_message(
    job_id: int, team_id: int, from_status: str, status: str, reason: str, time: datetime
) -> dict:
    return {
        "type": "job.status",
        "job": job_id,
        "team": team_id,
        "from": from_status,
        "status": status,
        "reason": reason,
        "time": time.isoformat(),
    }


def statuses_message(messages: list[dict]) -> dict:
    """Several `status_message`s for the list pages, in the order they were written."""
    return {"type": "job.statuses", "statuses": messages}


def metrics_message(kinds: Iterable[str], accepted: int) -> dict:
    """New metric points were stored: the open charts of these kinds should refresh."""
    return {"type": "job.metrics", "kinds": sorted(set(kinds)), "points": accepted}


def publish_metrics(job_id: int, kinds: Iterable[str], accepted: int) -> None:
    if accepted and _layer() is not None:
        sends = [(job_group(job_id), metrics_message(kinds, accepted))]
        transaction.on_commit(lambda: _post_now(sends))


def publish_lines(job_id: int, attempt: int, lines: list[dict], cursor: str) -> None:
    if lines and _layer() is not None:
        message = lines_message(attempt, lines, cursor)
        _send_on_commit([(job_group(job_id), message)])


def publish_membership_changed(user_id: int) -> None:
    """The user joined, left or changed role in a team: their consumers look again."""
    if _layer() is not None:
        _send_on_commit([(user_group(user_id), {"type": "membership.changed"})])


def publish_user_changed(user_id: int) -> None:
    """The user was saved (deactivated, staff flag, password): their consumers look again."""
    if _layer() is not None:
        _send_on_commit([(user_group(user_id), {"type": "user.changed"})])


def publish_session_ended(user_id: int, session_key: str) -> None:
    """The user signed out of one session: the streams it opened close."""
    if _layer() is not None:
        message = {"type": "session.ended", "session": session_digest(session_key)}
        _send_on_commit([(user_group(user_id), message)])


def session_digest(session_key: str) -> str:
    """What names a session on the channel layer: the key itself would sign in whoever reads it."""
    return hashlib.sha256(session_key.encode()).hexdigest()


def publish_statuses(messages: Iterable[dict]) -> None:
    """`status_message`s, each to its job's group, and to the jobs group in batches."""
    if _layer() is None:
        return
    messages = list(messages)
    sends = [(job_group(message["job"]), message) for message in messages]
    sends += [
        (JOBS_GROUP, statuses_message(messages[i : i + STATUS_BATCH]))
        for i in range(0, len(messages), STATUS_BATCH)
    ]
    if sends:
        _send_on_commit(sends)


def _layer() -> BaseChannelLayer | None:
    try:
        return get_channel_layer()
    except Exception:
        log.exception("the channel layer is misconfigured; live updates are off")
        return None


def _send_on_commit(sends: list[tuple[str, dict]]) -> None:
    transaction.on_commit(lambda: _send_now(sends))


def _send_now(sends: list[tuple[str, dict]]) -> None:
    layer = _layer()
    if layer is None:
        return
    try:
        if isinstance(layer, RedisChannelLayer):
            _sender_loop().run(_group_send_all(layer, sends))
        else:  # an in-memory layer's queues belong to the caller's loop
            async_to_sync(_group_send_all)(layer, sends)
    except Exception:
        groups = sorted({group for group, _ in sends})
        log.exception("live update to %s not sent; pages catch up through the API", groups)


def _post_now(sends: list[tuple[str, dict]]) -> None:
    """`_send_now` without waiting for the send (through the Redis layer; another layer's is
    waited for, its queues being the caller's loop's)."""
    layer = _layer()
    if not isinstance(layer, RedisChannelLayer):
        _send_now(sends)
        return
    _sender_loop().post(_group_send_all(layer, sends), sorted({group for group, _ in sends}))


class _SenderLoop:
    """An event loop in a daemon thread that publishes for every thread of this process.

    channels_redis keeps its Redis connections per event loop, and `async_to_sync` outside an
    ASGI server starts a fresh loop (a thread and a new connection) for every call: a Celery
    worker that records 25 launches at a time would pay that on every commit.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.lock, self.posted = threading.Lock(), 0
        threading.Thread(target=self.loop.run_forever, name="live-publish", daemon=True).start()

    def run(self, coroutine: Coroutine[Any, Any, None]) -> None:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        future.result(SEND_TIMEOUT_S + 1)  # the coroutine bounds itself; this is a backstop

    def post(self, coroutine: Coroutine[Any, Any, None], groups: list[str]) -> None:
        """Run `coroutine` on the loop without waiting for it; its failure is logged."""
        with self.lock:
            if self.posted >= POSTED_LIMIT:
                coroutine.close()
                log.warning("live update to %s dropped: %d still unsent", groups, self.posted)
                return
            self.posted += 1
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        future.add_done_callback(lambda done: self._sent(done, groups))

    def _sent(self, done: Any, groups: list[str]) -> None:
        with self.lock:
            self.posted -= 1
        if not done.cancelled() and done.exception() is not None:
            log.error(
                "live update to %s not sent; pages catch up through the API",
                groups,
                exc_info=done.exception(),
            )


_sender: _SenderLoop | None = None
_sender_lock = threading.Lock()


def _sender_loop() -> _SenderLoop:
    global _sender
    with _sender_lock:
        if _sender is None or _sender.pid != os.getpid():  # a forked child starts its own
            _sender = _SenderLoop()
        return _sender


async def _group_send_all(layer: BaseChannelLayer, sends: list[tuple[str, dict]]) -> None:
    async def send_all() -> None:
        listened = await _listened(layer, {group for group, _ in sends})
        for group, message in sends:
            if group in listened:
                await layer.group_send(group, message)

    await asyncio.wait_for(send_all(), SEND_TIMEOUT_S)


async def _listened(layer: BaseChannelLayer, groups: set[str]) -> set[str]:
    """The groups with a member, asked in one pipeline per Redis shard.

    channels_redis spends two round trips on a send even to an empty group, and most job
    groups are empty (no page open on that job): skipping them is what keeps a tick's publish
    short. A page that opens between the check and the send catches up through the API, as it
    does after any message it missed.
    """
    if not isinstance(layer, RedisChannelLayer):
        return groups
    by_shard: dict[int, list[str]] = defaultdict(list)
    for group in groups:
        by_shard[layer.consistent_hash(group)].append(group)
    # Members older than group_expiry are stale: group_send would discard them.
    alive = f"({int(time.time()) - layer.group_expiry}"
    listened: set[str] = set()
    for shard, names in by_shard.items():
        pipe = layer.connection(shard).pipeline(transaction=False)
        for group in names:
            pipe.zcount(layer._group_key(group), alive, "+inf")
        counts = await pipe.execute()
        listened.update(group for group, count in zip(names, counts, strict=True) if count)
    return listened
