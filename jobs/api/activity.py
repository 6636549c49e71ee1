"""The runner's activity reports and stack dumps (`/api/v1/ingest/activity`, `/dumps`).

A report is added to its attempt's activity by metering (`metering.activity.observe`); the
answer says whether the server wants the ranks' stacks now (`jobs.reads.activity.wants_dump`:
the attempt is about to be, or is, a suspected hang). Dumps are job-controlled text: kept
bounded (`DUMP_MAX_CHARS` per rank, ranks below the attempt's nodes), never interpreted, and
escaped wherever shown.
"""

from django.db import transaction
from django.utils import timezone
from ninja import Router, Schema

from jobs.api.ingest import attempt_body_doc, ingest_body, ingesting_attempt, runner_body
from jobs.auth import JobToken
from jobs.errors import BadRequest
from jobs.models import AttemptActivity
from jobs.reads.activity import wants_dump, watched
from jobs.schemas import ErrorOut, text_fault
from metering import activity

router = Router(auth=JobToken(), tags=["runner ingest"])
DUMP_MAX_CHARS = 64 * 1024
TRUNCATED = "\n[... cut: the dump was longer than the server keeps]"


class ActivityOut(Schema):
    dump: bool  # send the ranks' stack dumps now (POST /api/v1/ingest/dumps)


class DumpsOut(Schema):
    kept: int


RANK_DOC = {
    "type": "object",
    "required": ["rank"],
    "properties": {
        "rank": {"type": "integer", "minimum": 0},
        "lines": {"type": "integer", "minimum": 0, "description": "lines since the last report"},
        "cpu_s": {"type": ["number", "null"], "description": "CPU seconds of its process group"},
        "gpu_util": {"type": "array", "items": {"type": "number"}, "description": "max %"},
    },
}


@router.post(
    "/activity",
    response={200: ActivityOut, (400, 401, 404, 410, 413, 429): ErrorOut},
    summary="What each rank did since the runner's last report; answered with whether to dump",
    openapi_extra=attempt_body_doc(
        steps={"type": "integer", "minimum": 0, "description": "metric points since"},
        ranks={"type": "array", "items": RANK_DOC},
    ),
)
def ingest_activity(request):
    attempt = ingesting_attempt(request.auth)
    body = runner_body(ingest_body(request), attempt.number)
    report = activity.parse_report(body, attempt.nodes)
    now = timezone.now()
    activity.observe(attempt, report, now)
    row = watched(attempt.job_id)
    return {"dump": bool(row and row.attempt_id == attempt.pk and wants_dump(row, now))}


@router.post(
    "/dumps",
    response={200: DumpsOut, (400, 401, 404, 410, 413, 429): ErrorOut},
    summary="The ranks' Python stacks (py-spy dump), asked for by an activity report's answer",
    openapi_extra=attempt_body_doc(
        dumps={
            "type": "array",
            "items": {
                "type": "object",
                "required": ["rank", "text"],
                "properties": {"rank": {"type": "integer"}, "text": {"type": "string"}},
            },
        }
    ),
)
def ingest_dumps(request):
    attempt = ingesting_attempt(request.auth)
    body = runner_body(ingest_body(request), attempt.number)
    dumps = checked_dumps(body.get("dumps"), attempt.nodes)
    now = timezone.now()
    with transaction.atomic():
        row, _ = AttemptActivity.objects.select_for_update().get_or_create(
            attempt_id=attempt.pk,
            defaults={"busy_at": attempt.start_time or now, "moved_at": attempt.start_time or now},
        )
        row.dumps, row.dumps_at = dumps, now
        row.save(update_fields=["dumps", "dumps_at"])
    return {"kept": len(dumps)}


def checked_dumps(raw: object, nodes: int) -> list[dict]:
    """[{rank, text}] with distinct ranks below `nodes`, each text cut to DUMP_MAX_CHARS."""
    if not isinstance(raw, list) or len(raw) > nodes:
        raise BadRequest(f'"dumps" must be a list of at most {nodes} rank dump(s)')
    out, seen = [], set()
    for i, item in enumerate(raw):
        rank = item.get("rank") if isinstance(item, dict) else None
        text = item.get("text") if isinstance(item, dict) else None
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nodes:
            raise BadRequest(f"dumps[{i}].rank must be a rank below {nodes}")
        if rank in seen:
            raise BadRequest(f"dumps[{i}].rank {rank} is given twice")
        if not isinstance(text, str):
            raise BadRequest(f"dumps[{i}].text must be a string")
        if fault := text_fault(text):
            raise BadRequest(f"dumps[{i}].text {fault}")
        seen.add(rank)
        if len(text) > DUMP_MAX_CHARS:
            text = text[:DUMP_MAX_CHARS] + TRUNCATED
        out.append({"rank": rank, "text": text})
    return out
