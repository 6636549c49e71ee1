"""Live updates for console pages: payloads built where events are written, sent after commit.

Groups: ``job-<id>`` gets a job's log batches and status changes (the job page); ``jobs`` gets
every status change with the job's team (list pages; the list consumer forwards only the
user's teams); ``user-<id>`` hears that the user's memberships changed, so their open pages
check again what they may see.

The channel layer is lossy by design (a full channel drops messages), so a log batch carries
its attempt, its sequence numbers and the log cursor just after it: a page that sees a batch
not continuing the last line it shows fetches the missing range from the logs API.

Publishing never breaks a write: it runs after commit, is bounded by a timeout, and a failure
is logged and dropped (pages recover through the API).
"""

import asyncio
import logging
from collections.abc import Iterable
from datetime import datetime

from asgiref.sync import async_to_sync
from channels.layers import BaseChannelLayer, get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

JOBS_GROUP = "jobs"
SEND_TIMEOUT_S = 2.0


def job_group(job_id: int) -> str:
    return f"job-{job_id}"


def user_group(user_id: int) -> str:
    return f"user-{user_id}"


def lines_message(attempt: int, lines: list[dict], cursor: str) -> dict:
    """One appended batch (sorted, contiguous seqs) as the job page receives it."""
    return {
        "type": "job.lines",
        "attempt": attempt,
        "first_seq": lines[0]["seq"],
        "cursor": cursor,
        "lines": [
            {
                "seq": line["seq"],
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


def metrics_message(kinds: Iterable[str], accepted: int) -> dict:
    """New metric points were stored: the open charts of these kinds should refresh."""
    return {"type": "job.metrics", "kinds": sorted(set(kinds)), "points": accepted}


def publish_metrics(job_id: int, kinds: Iterable[str], accepted: int) -> None:
    if accepted and _layer() is not None:
        _send_on_commit([(job_group(job_id), metrics_message(kinds, accepted))])


def publish_lines(job_id: int, attempt: int, lines: list[dict], cursor: str) -> None:
    if lines and _layer() is not None:
        message = lines_message(attempt, lines, cursor)
        _send_on_commit([(job_group(job_id), message)])


def publish_membership_changed(user_id: int) -> None:
    """The user joined, left or changed role in a team: their consumers look again."""
    if _layer() is not None:
        _send_on_commit([(user_group(user_id), {"type": "membership.changed"})])


def publish_statuses(messages: Iterable[dict]) -> None:
    """`status_message`s, each to its job's group and to the jobs group."""
    if _layer() is None:
        return
    sends = []
    for message in messages:
        sends += [(job_group(message["job"]), message), (JOBS_GROUP, message)]
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
        async_to_sync(_group_send_all)(layer, sends)
    except Exception:
        groups = sorted({group for group, _ in sends})
        log.exception("live update to %s not sent; pages catch up through the API", groups)


async def _group_send_all(layer: BaseChannelLayer, sends: list[tuple[str, dict]]) -> None:
    async def send_all() -> None:
        for group, message in sends:
            await layer.group_send(group, message)

    await asyncio.wait_for(send_all(), SEND_TIMEOUT_S)
