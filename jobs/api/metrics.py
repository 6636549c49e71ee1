"""The metrics API: the runner's ingest of SDK points and the charts' read of them (`/api/v1`)."""

from typing import Literal

from django.conf import settings
from ninja import Query, Router, Schema
from pydantic import Field

from jobs import broadcast
from jobs.api.ingest import batch_body_doc, batch_items, ingest_body, ingesting_attempt
from jobs.auth import ConsoleSession, JobToken, UserToken
from jobs.models import BIGINT_MAX
from jobs.reads.visible import get_visible_job
from jobs.schemas import ErrorOut
from jobs.stores.metrics import charts, ingest

router = Router(tags=["metrics"])


class MetricIngestResult(Schema):
    accepted: int
    duplicates: int
    dropped: int = 0  # points past the attempt's cap (SF_ATTEMPT_MAX_METRIC_POINTS), not stored


POINT_DOC = {
    "type": "object",
    "required": ["seq", "kind", "name", "step", "value", "ts"],
    "properties": {
        "seq": {
            "type": "integer",
            "minimum": 0,
            "maximum": BIGINT_MAX,
            "description": "the attempt's point number",
        },
        "kind": {"enum": list(ingest.KINDS)},
        "name": {"type": "string", "minLength": 1, "maxLength": ingest.MAX_NAME},
        "step": {"type": "integer", "minimum": 0, "maximum": BIGINT_MAX},
        "value": {"type": "number"},
        "ts": {"type": "number", "description": "epoch seconds, by the runner's clock"},
    },
}


@router.post(
    "/ingest/metrics",
    auth=JobToken(),
    response={200: MetricIngestResult, (400, 401, 404, 410, 413, 429): ErrorOut},
    tags=["runner ingest"],
    summary="Append a batch of metric points",
    openapi_extra=batch_body_doc("points", POINT_DOC),
)
def ingest_metrics(request):
    attempt = ingesting_attempt(request.auth)
    points = _parse_batch(ingest_body(request), attempt.number)
    result = ingest.append(attempt.job_id, attempt.number, points)
    broadcast.publish_metrics(attempt.job_id, (p["kind"] for p in points), result.accepted)
    # Points past the attempt's cap are answered 200 too, so the runner does not resend them.
    return {"accepted": result.accepted, "duplicates": result.duplicates, "dropped": result.dropped}


def _parse_batch(body: bytes, attempt: int) -> list:
    # NaN/Infinity parse here and are refused point by point, with the point's index.
    limit = settings.SF_METRIC_BATCH_MAX_POINTS
    return batch_items(body, attempt, "points", limit, finite=False)


class MetricsQuery(Schema):
    kind: Literal["train", "validation", "system"] = "train"
    x: Literal["step", "time"] = Field("step", description="time: epoch seconds")
    max_points: int = Field(charts.DEFAULT_MAX_POINTS, ge=2, le=10_000, description="per series")


class SeriesOut(Schema):
    x: list[int | float]  # steps stay ints
    y: list[float]
    total: int
    downsampled: bool


class LatestOut(Schema):
    step: int
    value: float
    ts: float


class MetricsOut(Schema):
    series: dict[str, SeriesOut]
    latest: dict[str, LatestOut]


@router.get(
    "/jobs/{job_id}/metrics",
    auth=[UserToken(), ConsoleSession()],
    response={200: MetricsOut, (400, 401, 404, 422, 429): ErrorOut},
    summary="The job's metrics of one kind, each series downsampled (LTTB) to max_points",
)
def job_metrics(request, job_id: int, q: Query[MetricsQuery]):
    job = get_visible_job(request.auth, job_id)
    return {
        "series": charts.series(job.pk, q.kind, q.x, q.max_points),
        "latest": charts.latest(job.pk, q.kind),
    }
