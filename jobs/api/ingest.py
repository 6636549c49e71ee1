"""The runner's ingest (`/api/v1/ingest`): log lines, the start signal, the bootstrap exchange
and the snapshot download, each authenticated by the attempt's job token.

What a runner sends is a job's input (docs/ARCHITECTURE.md, invariant 7): every body is parsed
by hand against hard caps, and a token's ingest closes INGEST_GRACE_S after its attempt ends.
`jobs.api.metrics` reads its batches with the helpers here.
"""

import datetime as dt
import json

from django.conf import settings
from django.db.models import Q
from django.http import FileResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from ninja import Router
from ninja.decorators import decorate_view

from jobs.auth import BootstrapToken, JobToken
from jobs.errors import BadRequest, Conflict, Gone, NotFound
from jobs.executors.base import executor_class
from jobs.job_tokens import job_token_for, spend_bootstrap
from jobs.ledger import clocks
from jobs.models import Attempt
from jobs.schemas import CheckpointOut, ErrorOut, IngestResult, StartedOut, TokenExchangeOut
from jobs.states import JobStatus
from jobs.stores import logstore
from jobs.stores.objects import ObjectMissing
from jobs.stores.snapshots import open_snapshot

router = Router(auth=JobToken(), tags=["runner ingest"])
INGEST_GRACE_S = 120
SNAPSHOT_BLOCK = 1024 * 1024


def batch_items(body: bytes, attempt: int, field: str, limit: int, *, finite: bool) -> list:
    """The list under `field` of a runner's batch for `attempt`, or a 4xx saying what is wrong.

    With `finite`, NaN and Infinity are refused while parsing; otherwise the caller checks them.
    """
    items = runner_body(body, attempt, finite=finite).get(field)
    if not isinstance(items, list):
        raise BadRequest(f'"{field}" must be a list')
    if len(items) > limit:
        raise PayloadTooLarge(f"a batch holds at most {limit} {field}; this one has {len(items)}")
    return items


def ingest_body(request) -> bytes:
    """The runner's request body, refused with a 413 past SF_INGEST_MAX_BODY_BYTES.

    Read here rather than through request.body, whose cap (DATA_UPLOAD_MAX_MEMORY_SIZE) ends
    in a 500 and would refuse the long lines of a legitimate batch.
    """
    limit = settings.SF_INGEST_MAX_BODY_BYTES
    length = request.headers.get("Content-Length", "")
    declared_too_long = length.isdigit() and int(length) > limit
    body = b"" if declared_too_long else request.read(limit + 1)
    if declared_too_long or len(body) > limit:
        raise PayloadTooLarge(
            f"a batch is at most {limit} bytes; send fewer lines or points per request"
        )
    return body


def runner_body(body: bytes, attempt: int, *, finite: bool = True) -> dict:
    """A runner's JSON object naming this token's attempt, or a 400 saying what is wrong."""
    try:
        batch = json.loads(body, parse_constant=_refuse_constant if finite else None)
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON ({exc})") from exc
    except RecursionError:
        raise BadRequest("the body is nested too deeply to be a batch") from None
    sent = batch.get("attempt") if isinstance(batch, dict) else None
    if type(sent) is not int or sent != attempt:
        raise BadRequest(f'the body must be an object with "attempt": {attempt} (this token\'s)')
    return batch


def batch_body_doc(field: str, item: dict) -> dict:
    """The OpenAPI request body of a runner's batch (parsed by hand, for speed)."""
    schema = {
        "type": "object",
        "required": ["attempt", field],
        "properties": {
            "attempt": {"type": "integer", "description": "the attempt this job token names"},
            field: {"type": "array", "items": item},
        },
    }
    return {"requestBody": {"content": {"application/json": {"schema": schema}}}}


def ingesting_attempt(principal) -> Attempt:
    """The attempt a job token names, while its ingest is open: the attempt is its job's
    current one and open, or closed less than INGEST_GRACE_S ago (the runner's last flush).
    A request it authenticates is the runner's, so the attempt is seen alive now."""
    attempt, now = principal.row, timezone.now()
    job = attempt.job
    ended = attempt.end_time or (
        None if job.status in JobStatus.active() else job.status_changed_at
    )
    if job.current_attempt_id != attempt.pk or (
        ended is not None and (now - ended).total_seconds() >= INGEST_GRACE_S
    ):
        raise Gone(f"attempt {attempt.number} of job {job.pk} is over; its ingest is closed")
    if attempt.end_time is None and (
        attempt.alive_at is None or now - attempt.alive_at >= clocks.ALIVE_RESOLUTION
    ):
        clocks.seen_alive([attempt.pk], now)
    return attempt


LINE_DOC = {
    "type": "object",
    "required": ["seq", "stream", "ts", "text"],
    "properties": {
        "seq": {"type": "integer", "minimum": 0, "description": "the attempt's line number"},
        "rank": {
            "type": "integer",
            "minimum": 0,
            "description": "the rank that wrote it (multi-node jobs; below the attempt's nodes)",
        },
        "stream": {"enum": ["stdout", "stderr"]},
        "ts": {"type": "number", "description": "epoch seconds, by the runner's clock"},
        "text": {"type": "string"},
    },
}


@router.post(
    "/logs",
    response={200: IngestResult, (400, 401, 404, 409, 410, 413, 429): ErrorOut},
    summary="Append a batch of log lines",
    openapi_extra=batch_body_doc("lines", LINE_DOC),
)
def ingest_logs(request):
    attempt = ingesting_attempt(request.auth)
    lines = _parse_batch(ingest_body(request), attempt.number, attempt.nodes)
    result = logstore.append(attempt.job_id, attempt.number, lines)
    return {
        "accepted": result.accepted,
        "duplicates": result.duplicates,
        "next_seq": result.next_seq,
        "dropped": result.dropped,  # past the attempt's log cap: answered 200, not retried
    }


def attempt_body_doc(**more: dict) -> dict:
    """The OpenAPI body of a runner's request about its attempt, with `more` properties."""
    properties = {"attempt": {"type": "integer"}, **more}
    schema = {"type": "object", "required": ["attempt"], "properties": properties}
    return {"requestBody": {"content": {"application/json": {"schema": schema}}}}


# The body of a runner's request that carries nothing but the attempt it is about.
ATTEMPT_BODY_DOC = attempt_body_doc()


@router.post(
    "/started",
    response={200: StartedOut, (400, 401, 404, 410, 413, 429): ErrorOut},
    summary="The runner spawned the entrypoint: the attempt's start time, by the server's clock",
    openapi_extra=ATTEMPT_BODY_DOC,
)
def ingest_started(request):
    """Set the attempt's start time when nothing set it yet (counted once, never moved).

    The server's clock, not the runner's, so a node with a skewed clock cannot bill queued
    time; an attempt already closed (stopped while starting) keeps what it has. Where each
    rank of a multi-node job has a runner of its own (`RANK_RUNNERS`), rank 0's may start
    while others still wait: the engine's poll starts the clock once the last rank is up.
    """
    attempt = ingesting_attempt(request.auth)
    runner_body(ingest_body(request), attempt.number)
    if attempt.nodes > 1 and getattr(
        executor_class(attempt.job.cluster.kind), "RANK_RUNNERS", False
    ):
        return {"start_time": attempt.start_time}
    now = timezone.now()
    return {"start_time": clocks.mark_started(attempt, now, now)}


CHECKPOINT_BODY_DOC = attempt_body_doc(
    saved_at={"type": "number", "description": "epoch seconds: the newest checkpoint file's mtime"}
)


@router.post(
    "/checkpoint",
    response={200: CheckpointOut, (400, 401, 404, 410, 413, 429): ErrorOut},
    summary="When the job last saved a checkpoint (the newest file under SF_CHECKPOINT_DIR)",
    openapi_extra=CHECKPOINT_BODY_DOC,
)
def ingest_checkpoint(request):
    """Keep the newest checkpoint time the runner saw: the scheduler preempts the borrowers
    that saved most recently first. A file's mtime is the job's to set, so it is a claim: never
    later than now by the server's clock, and it only moves forward."""
    attempt = ingesting_attempt(request.auth)
    saved = runner_body(ingest_body(request), attempt.number).get("saved_at")
    if isinstance(saved, bool) or not isinstance(saved, int | float) or saved <= 0:
        raise BadRequest('"saved_at" must be a positive number of epoch seconds')
    now = timezone.now()
    at = min(dt.datetime.fromtimestamp(min(saved, now.timestamp()), dt.UTC), now)
    Attempt.objects.filter(pk=attempt.pk).filter(
        Q(checkpoint_at__isnull=True) | Q(checkpoint_at__lt=at)
    ).update(checkpoint_at=at)
    return {
        "checkpoint_at": Attempt.objects.values_list("checkpoint_at", flat=True).get(pk=attempt.pk)
    }


# The body of the bootstrap exchange: the attempt, and the rank where each has its own runner.
TOKEN_BODY_DOC = attempt_body_doc(
    rank={
        "type": "integer",
        "minimum": 0,
        "description": "the runner's rank (SF_NODE_RANK) where each rank of a multi-node job "
        "runs its own runner; 0 when left out",
    }
)


@router.post(
    "/token",
    auth=BootstrapToken(),
    response={200: TokenExchangeOut, (400, 401, 409, 410, 413, 429): ErrorOut},
    summary="Exchange the runner's one-time bootstrap credential for its job token",
    openapi_extra=TOKEN_BODY_DOC,
)
@decorate_view(never_cache)  # the answer holds the job token
def exchange_bootstrap(request):
    """Once per attempt, or once per rank where each rank of a multi-node job has a runner of
    its own (Kubernetes): the engines whose job specs others can read (the Ray dashboard, a
    pod spec) carry only this credential, spent by the runner at start."""
    attempt = ingesting_attempt(request.auth)
    body = runner_body(ingest_body(request), attempt.number)
    rank = body.get("rank", 0)
    if type(rank) is not int or not 0 <= rank < attempt.nodes:
        raise BadRequest(
            f'"rank" must be a whole number from 0 to {attempt.nodes - 1} (this attempt\'s '
            f"ranks), not {rank!r}"
        )
    if not spend_bootstrap(attempt, rank):
        whose = f" for rank {rank}" if attempt.nodes > 1 else ""
        raise Conflict(
            f"the bootstrap credential of attempt {attempt.number} of job {attempt.job_id} "
            f"was exchanged already{whose}; it works once"
        )
    return {"token": job_token_for(attempt)}


# Epoch seconds far past any clock; a larger number would read as Infinity in the browser.
MAX_TS = 1e12


def _parse_batch(body: bytes, attempt: int, nodes: int = 1) -> list[dict]:
    lines = batch_items(body, attempt, "lines", settings.SF_LOG_BATCH_MAX_LINES, finite=True)
    for i, line in enumerate(lines):
        if not (
            isinstance(line, dict)
            and type(line.get("seq")) is int
            and line["seq"] >= 0
            and line.get("stream") in ("stdout", "stderr")
            and type(line.get("ts")) in (int, float)
            and abs(line["ts"]) <= MAX_TS
            and isinstance(line.get("text"), str)
        ):
            raise BadRequest(
                f"line {i} must have seq (int >= 0), stream (stdout|stderr), "
                f"ts (epoch seconds, a number of at most {MAX_TS:.0e}) and text (string)"
            )
        rank = line.get("rank", 0)
        if type(rank) is not int or not 0 <= rank < nodes:
            raise BadRequest(f"line {i} has rank {rank!r}; this attempt has ranks 0 to {nodes - 1}")
    return lines


def _refuse_constant(name: str) -> float:
    # NaN and Infinity are not JSON: stored, they would break every reader of the log.
    raise ValueError(f"{name} is not a JSON number")


class PayloadTooLarge(BadRequest):
    status = 413


@router.get(
    "/snapshot",
    summary="The job's working-directory snapshot (.tar.gz)",
    response={200: None, (401, 404, 410, 429): ErrorOut},
)
def ingest_snapshot(request):
    attempt = ingesting_attempt(request.auth)
    snapshot = attempt.job.snapshot
    if snapshot is None:
        raise NotFound("this job was submitted without a snapshot")
    try:
        blob = open_snapshot(snapshot.sha256)
    except ObjectMissing:
        raise Gone("the job's working-directory snapshot was deleted") from None
    response = FileResponse(blob, content_type="application/gzip")
    response.block_size = SNAPSHOT_BLOCK
    response["Content-Length"] = snapshot.size  # an object store's reader has no length
    return response
