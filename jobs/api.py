"""The jobs API (`/api/v1`): submit, read, control, logs, snapshots, and the runner's ingest."""

import asyncio
import json
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import FileResponse, HttpResponse, StreamingHttpResponse
from django.utils import timezone
from ninja import Query, Router, Schema, Status
from pydantic import Field

from jobs import clocks, diagnostics, logstore, services, teams
from jobs.auth import BootstrapToken, ConsoleSession, JobToken, UserToken
from jobs.errors import BadRequest, Conflict, Gone, NotFound
from jobs.executors import executor_for
from jobs.job_tokens import job_token_for
from jobs.models import Attempt, Job, Membership
from jobs.schemas import (
    AttemptOut,
    DiagnosticsOut,
    ErrorOut,
    EventOut,
    IngestResult,
    JobIn,
    JobOut,
    JobPage,
    MeOut,
    SnapshotOut,
    StartedOut,
    Text,
    TokenExchangeOut,
)
from jobs.snapshots import snapshot_path, store_snapshot
from jobs.states import JobStatus
from metering.usage import attempt_gpu_seconds, job_gpu_seconds

# The CLI sends a token; the console its session (CSRF-checked on POST and DELETE).
router = Router(auth=[UserToken(), ConsoleSession()], tags=["jobs"])
ingest = Router(auth=JobToken(), tags=["runner ingest"])
INGEST_GRACE_S = 120
DOWNLOAD_PAGE_LINES = 10_000


def job_out(job: Job, virtual: dict[int, bool] | None = None) -> dict:
    attempt = services.current_attempt(job)
    why_not_retry = services.retry_unavailable_reason(job)
    if virtual is None or job.cluster_id not in virtual:
        virtual = {job.cluster_id: executor_for(job.cluster).capacity().virtual}
    return {
        "id": job.pk,
        "run_id": job.run_id,
        "name": job.name,
        "team": job.team.name,
        "user": job.user.username,
        "cluster": job.cluster.name,
        "backend": job.cluster.kind,
        "status": job.status,
        "status_reason": job.status_reason,
        "terminal": job.status in JobStatus.terminal(),
        "gpus": job.gpus,
        "virtual_gpus": virtual[job.cluster_id],
        "entrypoint": job.entrypoint,
        "priority": job.priority,
        "window": job.window.name if job.window else None,
        "window_policy": job.window_policy,
        "attempt": job.attempt_count,
        "retry_count": job.retry_count,
        "job_ref": attempt.job_ref if attempt else "",
        "submitted_at": job.submitted_at,
        "started_at": attempt.start_time if attempt else None,
        "ended_at": attempt.end_time if attempt else None,
        "exit_code": attempt.exit_code if attempt else None,
        "gpu_seconds": round(job_gpu_seconds(job.attempts.all()), 3),
        "output_dir": str(settings.SF_OUTPUT_ROOT / job.run_id),
        "snapshot": job.snapshot_id,
        "max_retries": job.max_retries,
        "retries_left": max(0, job.max_retries - job.retry_count),
        "retry_cooldown_s": job.retry_cooldown_s,
        "next_attempt_at": job.next_attempt_at,
        "retry_available": not why_not_retry,
        "retry_unavailable_reason": why_not_retry,
        "parent": job.parent_id,
        "follow_on_name": job.follow_on_name,
        "then": job.then,
    }


@router.get(
    "/me",
    response={200: MeOut, (401, 429): ErrorOut},
    summary="Who the token belongs to, and their teams",
)
def me(request):
    memberships = (
        Membership.objects.filter(user=request.auth)
        .select_related("team", "team__default_cluster")
        .order_by("pk")
    )
    teams = [
        {
            "name": m.team.name,
            "role": m.role,
            "gpu_quota": m.team.gpu_quota,
            "default_cluster": m.team.default_cluster.name if m.team.default_cluster else None,
        }
        for m in memberships
    ]
    return {
        "username": request.auth.username,
        "teams": teams,
        "default_team": teams[0]["name"] if teams else None,
    }


@router.post(
    "/snapshots",
    response={201: SnapshotOut, (400, 401, 403, 409, 413, 415, 429): ErrorOut},
    summary="Upload a working-directory .tar.gz for one of your teams",
    openapi_extra={
        "requestBody": {
            "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
            "required": True,
        }
    },
)
def upload_snapshot(request, team: Text | None = None):
    """For `team` (default: your only team you can upload to); `created` says whether that
    team did not have these bytes before, whatever other teams hold."""
    owner = teams.uploading_team(request.auth, team)
    length = request.headers.get("Content-Length")
    declared = int(length) if length and length.isdigit() else None
    snapshot, created = store_snapshot(
        request, request.content_type or "", declared, team=owner, user=request.auth
    )
    return Status(201, {"sha256": snapshot.sha256, "size": snapshot.size, "created": created})


@router.post(
    "/jobs",
    response={201: JobOut, (400, 401, 403, 404, 413, 422, 429): ErrorOut},
    summary="Submit a job",
)
def submit(request, data: JobIn):
    job = services.submit_job(request.auth, data)
    return Status(201, job_out(services.get_visible_job(request.auth, job.pk)))


class JobFilters(Schema):
    status: Text | None = None
    team: Text | None = None
    user: Text | None = None
    mine: bool = False
    limit: int = Field(50, ge=1, le=500)
    before: int | None = Field(None, ge=1, description="job id to page back from")


@router.get(
    "/jobs",
    response={200: JobPage, (400, 401, 422, 429): ErrorOut},
    summary="List jobs of your teams, newest first",
)
def list_jobs(request, filters: Query[JobFilters]):
    jobs = services.visible_jobs(request.auth)
    if filters.status:
        if filters.status.upper() not in JobStatus.values:
            raise BadRequest(
                f"unknown status {filters.status!r}; one of {', '.join(JobStatus.values)}"
            )
        jobs = jobs.filter(status=filters.status.upper())
    if filters.team:
        jobs = jobs.filter(team__name=filters.team)
    if filters.mine:
        jobs = jobs.filter(user=request.auth)
    elif filters.user:
        jobs = jobs.filter(user__username=filters.user)
    if filters.before:
        jobs = jobs.filter(pk__lt=filters.before)
    page = list(services.with_related(jobs).order_by("-pk")[: filters.limit + 1])
    more = len(page) > filters.limit
    page = page[: filters.limit]
    clusters = {j.cluster_id: j.cluster for j in page}
    virtual = {pk: executor_for(cluster).capacity().virtual for pk, cluster in clusters.items()}
    return {
        "items": [job_out(j, virtual) for j in page],
        "next_before": page[-1].pk if more else None,
    }


@router.get(
    "/jobs/{job_id}", response={200: JobOut, (401, 404, 422, 429): ErrorOut}, summary="One job"
)
def get_job(request, job_id: int):
    return job_out(services.get_visible_job(request.auth, job_id))


@router.delete(
    "/jobs/{job_id}",
    response={204: None, (401, 403, 404, 409, 422, 429): ErrorOut},
    summary="Delete a finished job",
)
def delete_job(request, job_id: int):
    services.delete_job(request.auth, job_id)
    return Status(204, None)


@router.get(
    "/jobs/{job_id}/events",
    response={200: list[EventOut], (401, 404, 422, 429): ErrorOut},
    summary="The job's timeline",
)
def job_events(request, job_id: int):
    job = services.get_visible_job(request.auth, job_id)
    return list(job.events.order_by("pk"))


@router.get(
    "/jobs/{job_id}/diagnostics",
    response={200: DiagnosticsOut, (401, 404, 422, 429): ErrorOut},
    summary="Why the job is where it is, in sentences (the console's Diagnostics tab)",
)
def job_diagnostics(request, job_id: int):
    job = services.get_visible_job(request.auth, job_id)
    return {"status": job.status, "sentences": diagnostics.explain(job)}


@router.get(
    "/jobs/{job_id}/attempts",
    response={200: list[AttemptOut], (401, 404, 422, 429): ErrorOut},
    summary="The job's attempts",
)
def job_attempts(request, job_id: int):
    job = services.get_visible_job(request.auth, job_id)
    now = timezone.now()
    return [
        {
            **{f: getattr(a, f) for f in AttemptOut.model_fields if f != "gpu_seconds"},
            "gpu_seconds": attempt_gpu_seconds(a.start_time, a.end_time, a.gpus, now),
        }
        for a in job.attempts.order_by("number")
    ]


def _verb(name: str, action):
    @router.post(
        f"/jobs/{{job_id}}/{name}",
        response={200: JobOut, (401, 403, 404, 409, 422, 429): ErrorOut},
        summary=f"{name.title()} a job",
        operation_id=f"{name}_job",
    )
    def view(request, job_id: int):
        return job_out(action(request.auth, job_id))

    return view


stop = _verb("stop", services.stop_job)
pause = _verb("pause", services.pause_job)
resume = _verb("resume", services.resume_job)
retry = _verb("retry", services.retry_job)


class LogQuery(Schema):
    cursor: str | None = Field(None, max_length=64, description="from a previous answer")
    tail: int | None = Field(None, ge=0, le=1_000_000, description="the last N lines (0: all)")
    follow: bool = False
    wait: float = Field(20.0, ge=0, le=30, description="seconds to wait for new lines")
    limit: int = Field(10_000, ge=1, le=settings.SF_LOG_PAGE_MAX_LINES)


@router.get(
    "/jobs/{job_id}/logs",
    summary="Log lines after a cursor; waits for new ones with follow",
    response={200: dict, (400, 401, 404, 422, 429): ErrorOut},
)
async def job_logs(request, job_id: int, q: Query[LogQuery]):
    job = await sync_to_async(services.get_visible_job)(request.auth, job_id)
    deadline = time.monotonic() + (q.wait if q.follow else 0)
    cursor = q.cursor
    while True:
        status = await sync_to_async(_status)(job.pk)  # before reading: no line can be missed
        page = await sync_to_async(_page)(job.pk, cursor, q.tail, q.limit)
        done = status in JobStatus.terminal() and page.at_end
        if page.raw_lines or done or time.monotonic() >= deadline:
            break
        cursor, q.tail = page.cursor, None
        await asyncio.sleep(0.25)
    body = (
        b'{"lines":['
        + b",".join(page.raw_lines)
        + b'],"cursor":'
        + json.dumps(page.cursor).encode()
        + b',"status":"'
        + status.encode()
        + b'","done":'
        + (b"true" if done else b"false")
        + b"}"
    )
    return HttpResponse(body, content_type="application/json")


def _status(job_id: int) -> str:
    return Job.objects.filter(pk=job_id).values_list("status", flat=True).get()


@router.get(
    "/jobs/{job_id}/logs/download",
    summary="The whole log of every attempt as plain text",
    response={200: None, (401, 404, 422, 429): ErrorOut},
)
async def download_logs(request, job_id: int):
    job = await sync_to_async(services.get_visible_job)(request.auth, job_id)
    response = StreamingHttpResponse(_log_text(job.pk), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-{job.run_id}.log"'
    return response


async def _log_text(job_id: int):
    """Every stored line, page by page, with an `==> attempt N <==` line before each attempt."""
    cursor, attempt = None, None
    while True:
        page = await sync_to_async(logstore.read)(job_id, cursor, DOWNLOAD_PAGE_LINES)
        chunk = []
        for raw in page.raw_lines:
            line = json.loads(raw)
            if line["attempt"] != attempt:
                attempt = line["attempt"]
                chunk.append(f"==> attempt {attempt} <==\n")
            chunk.append(line["text"] + "\n")
        if chunk:
            yield "".join(chunk).encode()
        if page.at_end or not page.raw_lines:
            return
        cursor = page.cursor


def _page(job_id: int, cursor: str | None, tail: int | None, limit: int) -> logstore.Page:
    try:
        if tail:
            return logstore.tail(job_id, min(tail, limit))
        return logstore.read(job_id, cursor, limit)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc


# -- the runner's side ---------------------------------------------------------------------------


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


def _ingesting_attempt(principal) -> Attempt:
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
        "stream": {"enum": ["stdout", "stderr"]},
        "ts": {"type": "number", "description": "epoch seconds, by the runner's clock"},
        "text": {"type": "string"},
    },
}


@ingest.post(
    "/logs",
    response={200: IngestResult, (400, 401, 404, 409, 410, 413, 429): ErrorOut},
    summary="Append a batch of log lines",
    openapi_extra=batch_body_doc("lines", LINE_DOC),
)
def ingest_logs(request):
    attempt = _ingesting_attempt(request.auth)
    lines = _parse_batch(ingest_body(request), attempt.number)
    result = logstore.append(attempt.job_id, attempt.number, lines)
    return {
        "accepted": result.accepted,
        "duplicates": result.duplicates,
        "next_seq": result.next_seq,
        "dropped": result.dropped,  # past the attempt's log cap: answered 200, not retried
    }


# The body of a runner's request that carries nothing but the attempt it is about.
ATTEMPT_BODY_DOC = {
    "requestBody": {
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["attempt"],
                    "properties": {"attempt": {"type": "integer"}},
                }
            }
        }
    }
}


@ingest.post(
    "/started",
    response={200: StartedOut, (400, 401, 404, 410, 413, 429): ErrorOut},
    summary="The runner spawned the entrypoint: the attempt's start time, by the server's clock",
    openapi_extra=ATTEMPT_BODY_DOC,
)
def ingest_started(request):
    """Set the attempt's start time when nothing set it yet (counted once, never moved).

    The server's clock, not the runner's, so a node with a skewed clock cannot bill queued
    time; an attempt already closed (stopped while starting) keeps what it has.
    """
    attempt = _ingesting_attempt(request.auth)
    runner_body(ingest_body(request), attempt.number)
    now = timezone.now()
    return {"start_time": clocks.mark_started(attempt, now, now)}


@ingest.post(
    "/token",
    auth=BootstrapToken(),
    response={200: TokenExchangeOut, (400, 401, 409, 410, 413, 429): ErrorOut},
    summary="Exchange the runner's one-time bootstrap credential for its job token",
    openapi_extra=ATTEMPT_BODY_DOC,
)
def exchange_bootstrap(request):
    """Once per attempt: the engines whose job specs others can read (the Ray dashboard, a pod
    spec) carry only this credential, spent by the runner at start."""
    attempt = _ingesting_attempt(request.auth)
    runner_body(ingest_body(request), attempt.number)
    spent = Attempt.objects.filter(pk=attempt.pk, bootstrap_used_at__isnull=True).update(
        bootstrap_used_at=timezone.now()
    )
    if not spent:
        raise Conflict(
            f"the bootstrap credential of attempt {attempt.number} of job {attempt.job_id} "
            "was exchanged already; it works once"
        )
    return {"token": job_token_for(attempt)}


# Epoch seconds far past any clock; a larger number would read as Infinity in the browser.
MAX_TS = 1e12


def _parse_batch(body: bytes, attempt: int) -> list[dict]:
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
    return lines


def _refuse_constant(name: str) -> float:
    # NaN and Infinity are not JSON: stored, they would break every reader of the log.
    raise ValueError(f"{name} is not a JSON number")


class PayloadTooLarge(BadRequest):
    status = 413


@ingest.get(
    "/snapshot",
    summary="The job's working-directory snapshot (.tar.gz)",
    response={200: None, (401, 404, 410, 429): ErrorOut},
)
def ingest_snapshot(request):
    attempt = _ingesting_attempt(request.auth)
    sha = attempt.job.snapshot_id
    if not sha:
        raise NotFound("this job was submitted without a snapshot")
    path = snapshot_path(sha)
    if not path.exists():
        raise Gone("the job's working-directory snapshot was deleted")
    return FileResponse(open(path, "rb"), content_type="application/gzip")
