"""The jobs API (`/api/v1`): submit, read, control, logs and snapshots, for the CLI (a user
token) and the console (its session). The runner's side is `jobs.api.ingest`."""

import asyncio
import json
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.utils import timezone
from ninja import Query, Router, Schema, Status
from pydantic import Field

from jobs.actions import control
from jobs.actions.submit import submit_job
from jobs.api.renderer import RENDERER
from jobs.auth import ConsoleSession, UserToken
from jobs.errors import BadRequest, NotFound
from jobs.models import Job, Membership
from jobs.reads import diagnostics, teams
from jobs.reads.job_out import job_out, rank_rows
from jobs.reads.job_rows import JobFilter, job_page, job_row, job_timeline
from jobs.reads.queue import queue_places
from jobs.reads.visible import get_visible_job
from jobs.schemas import (
    AttemptOut,
    DiagnosticsOut,
    ErrorOut,
    EventOut,
    JobIn,
    JobOut,
    JobPage,
    MeOut,
    SnapshotOut,
    Text,
)
from jobs.states import JobStatus
from jobs.stores import logstore
from jobs.stores.snapshots import store_snapshot
from metering.cost import attempt_costs
from metering.prices import amount
from metering.usage import attempt_gpu_seconds

# The CLI sends a token; the console its session (CSRF-checked on POST and DELETE).
router = Router(auth=[UserToken(), ConsoleSession()], tags=["jobs"])
DOWNLOAD_PAGE_LINES = 10_000
# AttemptOut's fields not read straight off the row
COMPUTED = ("gpu_seconds", "ranks", "gpus", "cost", "cost_split")
LOG_FOLLOW_STEP_S = 0.25  # a held follow looks for new lines this often
FOLLOW_POLL_S = 1.0  # and a follow not held (SF_LOG_FOLLOW_HOLD_S) is asked again after this
CONTENT_TYPE = f"{RENDERER.media_type}; charset={RENDERER.charset}"


def _job_answer(request, job_id: int, status: int = 200) -> HttpResponse:
    found = job_row(request.auth, job_id)
    if found is None:
        raise NotFound(f"job {job_id} does not exist or belongs to a team you are not in")
    row, started = found
    place = queue_places([row.job], request.auth.is_staff)[job_id]
    answer = job_out(row.job, row.shown, started, place, timezone.now(), request.auth.is_staff)
    return _answer(request, answer, status)


def _answer(request: HttpRequest, body: object, status: int = 200) -> HttpResponse:
    """`body` rendered as ninja renders a view's return value, without validating it again
    against the response schema: the builders here produce it to that schema (pinned by
    tests/api/test_api_query_counts.py and the schemathesis suite)."""
    content = RENDERER.render(request, body, response_status=status)
    return HttpResponse(content, status=status, content_type=CONTENT_TYPE)


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
    job = submit_job(request.auth, data)
    return _job_answer(request, job.pk, 201)


class JobFilters(Schema):
    status: Text | None = None
    team: Text | None = None
    user: Text | None = None
    mine: bool = False
    limit: int = Field(50, ge=1, le=500)
    before: int | None = Field(None, ge=1, description="job id to page back from")
    tasks: bool = Field(True, description="false: leave out the tasks of job arrays")


@router.get(
    "/jobs",
    response={200: JobPage, (400, 401, 422, 429): ErrorOut},
    summary="List jobs of your teams, newest first",
)
def list_jobs(request, filters: Query[JobFilters]):
    status = filters.status.upper() if filters.status else None
    if status and status not in JobStatus.values:
        raise BadRequest(f"unknown status {filters.status!r}; one of {', '.join(JobStatus.values)}")
    wanted = JobFilter(
        status=status,
        team=filters.team,
        user=filters.user,
        mine=filters.mine,
        before=filters.before,
        limit=filters.limit + 1,
        tasks=filters.tasks,
    )
    page, started = job_page(request.auth, wanted)
    more = len(page) > filters.limit
    page = page[: filters.limit]
    now = timezone.now()
    staff = request.auth.is_staff
    places = queue_places([row.job for row in page], staff)
    items = [
        job_out(row.job, row.shown, started[row.job["id"]], places[row.job["id"]], now, staff)
        for row in page
    ]
    return _answer(request, {"items": items, "next_before": page[-1].job["id"] if more else None})


@router.get(
    "/jobs/{job_id}", response={200: JobOut, (401, 404, 422, 429): ErrorOut}, summary="One job"
)
def get_job(request, job_id: int):
    return _job_answer(request, job_id)


@router.delete(
    "/jobs/{job_id}",
    response={204: None, (401, 403, 404, 409, 422, 429): ErrorOut},
    summary="Delete a finished job",
)
def delete_job(request, job_id: int):
    control.delete_job(request.auth, job_id)
    return Status(204, None)


@router.get(
    "/jobs/{job_id}/events",
    response={200: list[EventOut], (401, 404, 422, 429): ErrorOut},
    summary="The job's timeline",
)
def job_events(request, job_id: int):
    events = job_timeline(request.auth, job_id)
    if events is None:
        raise NotFound(f"job {job_id} does not exist or belongs to a team you are not in")
    return _answer(request, events)


@router.get(
    "/jobs/{job_id}/diagnostics",
    response={200: DiagnosticsOut, (401, 404, 422, 429): ErrorOut},
    summary="Why the job is where it is, in sentences (the console's Diagnostics tab)",
)
def job_diagnostics(request, job_id: int):
    job = get_visible_job(request.auth, job_id)
    return {"status": job.status, "sentences": diagnostics.explain(job)}


@router.get(
    "/jobs/{job_id}/attempts",
    response={200: list[AttemptOut], (401, 404, 422, 429): ErrorOut},
    summary="The job's attempts",
)
def job_attempts(request, job_id: int):
    job = get_visible_job(request.auth, job_id)
    now = timezone.now()
    attempts = list(job.attempts.order_by("number"))
    costs = attempt_costs(job.cluster_id, job.gpu_type, attempts, now)
    return [
        {
            **{f: getattr(a, f) for f in AttemptOut.model_fields if f not in COMPUTED},
            "ranks": rank_rows(a.ranks),
            "gpus": a.total_gpus,  # /api/v1's first name for it
            "gpu_seconds": attempt_gpu_seconds(a.start_time, a.end_time, a.total_gpus, now),
            "cost": amount(cost.micros),
            "cost_split": cost.split,
        }
        for a, cost in zip(attempts, costs, strict=True)
    ]


def _verb(name: str, action):
    @router.post(
        f"/jobs/{{job_id}}/{name}",
        response={200: JobOut, (401, 403, 404, 409, 422, 429): ErrorOut},
        summary=f"{name.title()} a job",
        operation_id=f"{name}_job",
    )
    def view(request, job_id: int):
        action(request.auth, job_id)
        return _job_answer(request, job_id)

    return view


stop = _verb("stop", control.stop_job)
pause = _verb("pause", control.pause_job)
resume = _verb("resume", control.resume_job)
retry = _verb("retry", control.retry_job)


class LogQuery(Schema):
    cursor: str | None = Field(None, max_length=64, description="from a previous answer")
    tail: int | None = Field(None, ge=0, le=1_000_000, description="the last N lines (0: all)")
    follow: bool = False
    wait: float = Field(20.0, ge=0, le=30, description="seconds to wait for new lines")
    poll: bool = Field(
        False,
        description="the client waits poll_after_s before its next follow, so a server whose "
        "workers must not be held (SF_LOG_FOLLOW_HOLD_S) may answer at once",
    )
    limit: int = Field(10_000, ge=1, le=settings.SF_LOG_PAGE_MAX_LINES)
    rank: int | None = Field(
        None,
        ge=0,
        description="only this rank's lines (a multi-node job); the cursor still "
        "points just after the last line scanned",
    )


@router.get(
    "/jobs/{job_id}/logs",
    summary="Log lines after a cursor; waits for new ones with follow",
    response={200: dict, (400, 401, 404, 422, 429): ErrorOut},
)
async def job_logs(request, job_id: int, q: Query[LogQuery]):
    job = await sync_to_async(get_visible_job)(request.auth, job_id)
    rank = _rank_filter(job, q.rank)
    hold = 0.0
    if q.follow:
        # A client that does not pause between follows (an older `sf`) is held as it asks:
        # answered at once, it would ask again at once, over and over.
        hold = min(q.wait, settings.SF_LOG_FOLLOW_HOLD_S) if q.poll else q.wait
    deadline = time.monotonic() + hold
    cursor = q.cursor
    while True:
        status = await sync_to_async(_status)(job.pk)  # before reading: no line can be missed
        page = await sync_to_async(_page)(job.pk, cursor, q.tail, q.limit, rank)
        done = status in JobStatus.terminal() and page.at_end
        if page.raw_lines or done or time.monotonic() >= deadline:
            break
        cursor, q.tail = page.cursor, None
        await asyncio.sleep(LOG_FOLLOW_STEP_S)
    # A follow answered before its wait was up, with nothing new and more to come: when to ask
    # again.
    poll_after = FOLLOW_POLL_S if q.follow and hold < q.wait and not (page.raw_lines or done) else 0
    body = (
        b'{"lines":['
        + b",".join(page.raw_lines)
        + b'],"cursor":'
        + json.dumps(page.cursor).encode()
        + b',"status":"'
        + status.encode()
        + b'","done":'
        + (b"true" if done else b"false")
        + b',"poll_after_s":'
        + str(poll_after).encode()
        + b"}"
    )
    return HttpResponse(body, content_type="application/json")


def _rank_filter(job: Job, rank: int | None) -> int | None:
    """The rank the store filters on: None for every line, and for rank 0 of a single-node job,
    whose lines carry no rank (the job is its rank 0)."""
    if rank is None:
        return None
    if rank >= job.nodes:
        ranks = "its only rank is 0" if job.nodes == 1 else f"its ranks are 0 to {job.nodes - 1}"
        raise BadRequest(f"job {job.pk} has no rank {rank}: {ranks}")
    return rank if job.nodes > 1 else None


def _status(job_id: int) -> str:
    return Job.objects.filter(pk=job_id).values_list("status", flat=True).get()


@router.get(
    "/jobs/{job_id}/logs/download",
    summary="The whole log of every attempt as plain text",
    response={200: None, (401, 404, 422, 429): ErrorOut},
)
async def download_logs(request, job_id: int):
    job = await sync_to_async(get_visible_job)(request.auth, job_id)
    response = StreamingHttpResponse(_log_text(job.pk), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-{job.run_id}.log"'
    return response


async def _log_text(job_id: int):
    """Every stored line, page by page, with an `==> attempt N <==` line before each attempt;
    a multi-node job's lines marked `[rank N]`, as the runner's console.log marks them."""
    cursor, attempt = None, None
    while True:
        page = await sync_to_async(logstore.read)(job_id, cursor, DOWNLOAD_PAGE_LINES)
        chunk = []
        for raw in page.raw_lines:
            line = json.loads(raw)
            if line["attempt"] != attempt:
                attempt = line["attempt"]
                chunk.append(f"==> attempt {attempt} <==\n")
            if "rank" in line:
                chunk.append(f"[rank {line['rank']}] ")
            chunk.append(line["text"] + "\n")
        if chunk:
            yield "".join(chunk).encode()
        if page.at_end or not page.raw_lines:
            return
        cursor = page.cursor


def _page(
    job_id: int, cursor: str | None, tail: int | None, limit: int, rank: int | None
) -> logstore.Page:
    try:
        if tail:
            return logstore.tail(job_id, min(tail, limit), rank)
        return logstore.read(job_id, cursor, limit, rank)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
