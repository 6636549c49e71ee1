"""The project's one NinjaAPI: mounts the app routers and maps domain errors to 4xx answers."""

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from jobs.api.activity import router as activity_router
from jobs.api.arrays import router as arrays_router
from jobs.api.audit import router as audit_router
from jobs.api.ingest import router as ingest_router
from jobs.api.jobs import router as jobs_router
from jobs.api.metrics import router as metrics_router
from jobs.api.policies import router as policies_router
from jobs.api.renderer import RENDERER
from jobs.api.teams import router as teams_router
from jobs.api.tokens import router as tokens_router
from jobs.api.webhooks import router as webhooks_router
from jobs.errors import ApiError
from jobs.ledger.transitions import TransitionRefused
from jobs.stores.logstore import LogGap
from jobs.stores.snapshots import SnapshotRefused
from metering.api import router as usage_router

log = logging.getLogger(__name__)
# Operation ids are made from the view's module, and generated clients name operations by id:
# these keep the ids the routers had before they moved under jobs/api/ (pinned by a test).
OPERATION_ID_PREFIX = {
    "jobs.api.jobs": "jobs_api",
    "jobs.api.ingest": "jobs_api",
    "jobs.api.metrics": "jobs_metrics_api",
    "jobs.api.teams": "jobs_teams_api",
    "jobs.api.tokens": "jobs_tokens_api",
    "jobs.api.webhooks": "jobs_webhooks_api",
    "jobs.api.arrays": "jobs_arrays_api",
}


class StarforgeAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation) -> str:
        view = operation.view_func
        prefix = OPERATION_ID_PREFIX.get(view.__module__)
        if prefix is None:
            return super().get_openapi_operation_id(operation)
        return f"{prefix}_{view.__name__}"


api = StarforgeAPI(
    title="Starforge API",
    version="1",
    urls_namespace="api",
    docs_url="/docs",
    renderer=RENDERER,
)
api.add_router("/v1", jobs_router)
api.add_router("/v1/ingest", ingest_router)
api.add_router("/v1/ingest", activity_router)
api.add_router("/v1", metrics_router)
api.add_router("/v1", tokens_router)
api.add_router("/v1", teams_router)
api.add_router("/v1", policies_router)
api.add_router("/v1", usage_router)
api.add_router("/v1", webhooks_router)
api.add_router("/v1", arrays_router)
api.add_router("/v1", audit_router)


def _answer(request: HttpRequest, http_status: int, detail: str, /, **extra):
    # Positional-only: `extra` may carry a body field named "status" (the job's).
    return api.create_response(request, {"detail": detail, **extra}, status=http_status)


@api.exception_handler(ApiError)
def on_api_error(request, exc: ApiError):
    return _answer(request, exc.status, exc.detail, **exc.extra)


@api.exception_handler(TransitionRefused)
def on_refused(request, exc: TransitionRefused):
    return _answer(request, 409, str(exc), status=exc.current)


@api.exception_handler(SnapshotRefused)
def on_snapshot_refused(request, exc: SnapshotRefused):
    return _answer(request, exc.http_status, str(exc))


@api.exception_handler(LogGap)
def on_log_gap(request, exc: LogGap):
    return _answer(request, 409, str(exc), next_seq=exc.next_seq)


@api.exception_handler(ValidationError)
def on_invalid(request, exc: ValidationError):
    sentences = []
    for error in exc.errors:
        where = ".".join(str(p) for p in error.get("loc", ()) if p not in ("body", "data", "query"))
        msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        sentences.append(f"{where or 'request'}: {msg}")
    return _answer(request, 422, "; ".join(sentences) or "invalid request", errors=exc.errors)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request, exc):
    return _answer(request, 401, "missing, unknown or revoked token; run `sf login` again")


@api.exception_handler(HttpError)
def on_http_error(request, exc: HttpError):
    return _answer(request, exc.status_code, str(exc))


@api.exception_handler(RequestDataTooBig)
def on_body_too_big(request, exc: RequestDataTooBig):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return _answer(request, 413, f"the request body is over {limit} bytes; send less at a time")


@api.exception_handler(SuspiciousOperation)
def on_suspicious(request, exc: SuspiciousOperation):
    # e.g. more query parameters than DATA_UPLOAD_MAX_NUMBER_FIELDS: Django's own sentence.
    return _answer(request, 400, str(exc))


@api.exception_handler(Exception)
def on_unexpected(request, exc: Exception):
    log.exception("unhandled error in %s %s", request.method, request.path)
    return _answer(request, 500, "internal error; the server log has the details")
