"""Starforge as an MLflow tracking server (`sf.contract.TRACKING_PATH`, `/mlflow`): the REST
routes MLflow's official client calls under `/mlflow/api/2.0/mlflow/`, with their callers'
rights (issue 49, point 1). Wire format: `jobs.api.mlflow_wire`; what reads show:
`jobs.reads.mlflow`; writes: `jobs.stores.metrics.ingest.append_tracked`, `jobs.stores.params`.

Two credentials, nothing else (`jobs.auth.mlflow_caller`):
- a job's tracking token (`MLFLOW_TRACKING_TOKEN`) adds to its own attempt, while the attempt's
  job token would be honoured (its job's current attempt, open or closed less than the ingest
  grace ago): it creates, updates and ends its run, logs metrics, params and tags, and reads
  only what `mlflow.start_run`, `set_experiment` and the logging calls ask for, of its own run
  and its own team's experiment. Any other run or experiment does not exist for it; the
  searches and histories are refused.
- a member's API token reads the runs and experiments of their teams and writes nothing.
Plain Django views rather than django-ninja: MLflow's client wants its own error shape for every
refusal (never an HTML page), and `log_batch` is a hot path. Not in the OpenAPI document.
"""

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from jobs import broadcast
from jobs.api.ingest import INGEST_GRACE_S
from jobs.api.mlflow_wire import (
    MAX_PARAM_VALUE,
    MAX_TAG_VALUE,
    MlflowError,
    answer,
    error_answer,
    integer,
    invalid,
    key_values,
    metric_columns,
    missing,
    request_fields,
    run_id_of,
    text,
    text_list,
)
from jobs.auth import TrackingPrincipal, mlflow_caller
from jobs.errors import ApiError
from jobs.models import Attempt
from jobs.reads import mlflow as reads
from jobs.states import JobStatus
from jobs.stores import params as params_store
from jobs.stores.metrics import ingest

PREFIX = "api/2.0/mlflow/"
Caller = User | TrackingPrincipal
Handler = Callable[[Caller, dict], dict]


@dataclass(frozen=True)
class Route:
    methods: tuple[str, ...]
    handler: Handler
    job: bool  # a tracking token may call it (on its own attempt only)
    user: bool  # a user token may call it (reads of their teams)


@csrf_exempt
def endpoint(request: HttpRequest, path: str) -> HttpResponse:
    """Every request under the MLflow root: the route's answer, or MLflow's error shape."""
    try:
        route = _route(request, path)
        caller = _caller(request, route)
        return answer(route.handler(caller, request_fields(request)))
    except MlflowError as error:
        return error_answer(error)
    except ApiError as error:  # a refused or throttled token (jobs.auth, jobs.throttle)
        code = "REQUEST_LIMIT_EXCEEDED" if error.status == 429 else "UNAUTHENTICATED"
        return error_answer(MlflowError(code, str(error), error.status))


def _route(request: HttpRequest, path: str) -> Route:
    route = ROUTES.get(path.removeprefix(PREFIX).rstrip("/")) if path.startswith(PREFIX) else None
    if route is None:
        raise MlflowError(
            "ENDPOINT_NOT_FOUND",
            f"Starforge's MLflow endpoint does not serve /mlflow/{path[:200]}: it keeps runs, "
            "metrics, params and tags, not artifacts, models or traces",
        )
    if request.method not in route.methods:
        raise MlflowError(
            "ENDPOINT_NOT_FOUND",
            f"/mlflow/{path} takes {' or '.join(route.methods)}, not {request.method}",
            405,
        )
    return route


def _caller(request: HttpRequest, route: Route) -> Caller:
    caller = mlflow_caller(request)
    if caller is None:
        raise MlflowError(
            "UNAUTHENTICATED",
            "send a job's MLFLOW_TRACKING_TOKEN or your Starforge API token as a bearer token",
        )
    if isinstance(caller, TrackingPrincipal):
        if not route.job:
            raise MlflowError(
                "PERMISSION_DENIED",
                "a job's tracking token only logs into its own run; read runs with a member's "
                "API token",
            )
        _refuse_closed(caller.row)
    elif not route.user:
        raise MlflowError(
            "PERMISSION_DENIED",
            "a user's API token reads runs; only a job's tracking token logs into its run",
        )
    return caller


def _refuse_closed(attempt: Attempt) -> None:
    """A tracking token is honoured while its attempt's job token is (`jobs.api.ingest`):
    the job's current attempt, open or closed less than INGEST_GRACE_S ago."""
    job, now = attempt.job, timezone.now()
    ended = attempt.end_time or (
        None if job.status in JobStatus.active() else job.status_changed_at
    )
    if job.current_attempt_id != attempt.pk or (
        ended is not None and (now - ended).total_seconds() >= INGEST_GRACE_S
    ):
        raise MlflowError(
            "UNAUTHENTICATED",
            f"attempt {attempt.number} of job {job.pk} is over; its tracking token is closed",
        )


# -- the attempt's own run (tracking token) ----------------------------------------------------


def _own(caller: Caller, fields: dict) -> TrackingPrincipal:
    """The tracking token's attempt, when the request names its own run; any other run does
    not exist for it."""
    assert isinstance(caller, TrackingPrincipal)
    named = run_id_of(fields)
    if named != reads.run_id(caller.job_id, caller.attempt):
        raise missing(f"run {named!r}")
    return caller


def create_run(caller: Caller, fields: dict) -> dict:
    """A job is one run: every create in an attempt (nested runs too) answers the attempt's
    run, with the tags sent kept."""
    assert isinstance(caller, TrackingPrincipal)
    tags = key_values(fields.get("tags", []), "tags", MAX_TAG_VALUE)
    params_store.set_tags(caller.job_id, caller.attempt, tags)
    return {"run": _run_of(caller)}


def update_run(caller: Caller, fields: dict) -> dict:
    """Accepted and kept as tags: the status a job's code reports is data, the run's status is
    the ledger's (`jobs.reads.mlflow`)."""
    own = _own(caller, fields)
    reported = {
        "mlflow.reportedStatus": text(fields, "status") or "",
        "mlflow.runName": text(fields, "run_name") or "",
    }
    params_store.set_tags(own.job_id, own.attempt, {k: v for k, v in reported.items() if v})
    return {"run_info": _run_of(own)["info"]}


def log_metric(caller: Caller, fields: dict) -> dict:
    own = _own(caller, fields)
    _store_metrics(own, [fields])
    return {}


def log_param(caller: Caller, fields: dict) -> dict:
    own = _own(caller, fields)
    _store_params(own, key_values([fields], "params", MAX_PARAM_VALUE))
    return {}


def set_tag(caller: Caller, fields: dict) -> dict:
    own = _own(caller, fields)
    params_store.set_tags(own.job_id, own.attempt, key_values([fields], "tags", MAX_TAG_VALUE))
    return {}


def log_batch(caller: Caller, fields: dict) -> dict:
    own = _own(caller, fields)
    params = key_values(fields.get("params", []), "params", MAX_PARAM_VALUE)
    tags = key_values(fields.get("tags", []), "tags", MAX_TAG_VALUE)
    metrics = fields.get("metrics", [])
    if not isinstance(metrics, list):
        raise invalid("'metrics' must be a list")
    if metrics:
        _store_metrics(own, metrics)
    _store_params(own, params)
    params_store.set_tags(own.job_id, own.attempt, tags)
    return {}


def log_inputs(caller: Caller, fields: dict) -> dict:
    """Datasets and models a run used: accepted and not kept (Starforge has no dataset store),
    so training code that logs them (autologging does) goes on."""
    _own(caller, fields)
    return {}


def create_experiment(caller: Caller, fields: dict) -> dict:
    """`mlflow.set_experiment(name)` in a job: a job's runs are its team's, whatever name its
    code asks for, so the answer is the team's experiment."""
    assert isinstance(caller, TrackingPrincipal)
    text(fields, "name", required=True, limit=500)
    return {"experiment_id": str(caller.row.job.team_id)}


def _store_metrics(own: TrackingPrincipal, items: list) -> None:
    columns = metric_columns(items)
    result = ingest.append_tracked(
        own.job_id,
        own.attempt,
        columns.kind,
        columns.name,
        columns.step,
        columns.value,
        columns.ts,
    )
    broadcast.publish_metrics(own.job_id, columns.kind, result.accepted)


def _store_params(own: TrackingPrincipal, params: dict[str, str]) -> None:
    try:
        params_store.log_params(own.job_id, own.attempt, params)
    except params_store.ParamChanged as refusal:
        raise invalid(str(refusal)) from None


def _run_of(own: TrackingPrincipal) -> dict:
    attempt = reads.readable_attempt(None, own.job_id, own.attempt)
    assert attempt is not None  # the token's attempt was just read
    return reads.run_json(attempt)


# -- reads (a member's token; the tracking token on its own run and experiment only) ----------


def get_run(caller: Caller, fields: dict) -> dict:
    named = run_id_of(fields)
    key = reads.run_key(named)
    if isinstance(caller, TrackingPrincipal):
        key = key if key == (caller.job_id, caller.attempt) else None
    attempt = reads.readable_attempt(_reader(caller), *key) if key else None
    if attempt is None:
        raise missing(f"run {named!r}")
    return {"run": reads.run_json(attempt)}


def get_experiment(caller: Caller, fields: dict) -> dict:
    named = text(fields, "experiment_id", required=True)
    team_id = int(named) if named and named.isdigit() and len(named) < 19 else None
    found = None
    if team_id is not None and _may_see_team(caller, team_id):
        found = reads.experiment(_reader(caller), team_id)
    if found is None:
        raise missing(f"experiment {named!r}")
    return {"experiment": found}


def get_experiment_by_name(caller: Caller, fields: dict) -> dict:
    name = text(fields, "experiment_name", required=True, limit=500)
    found = reads.experiment(_reader(caller), 0, name=name)
    if found is None or not _may_see_team(caller, int(found["experiment_id"])):
        raise missing(f"experiment {name!r}")
    return {"experiment": found}


def search_experiments(caller: Caller, fields: dict) -> dict:
    assert isinstance(caller, User)
    if text(fields, "filter", limit=1000):
        raise invalid("Starforge's experiments (its teams) take no filter")
    limit = integer(fields, "max_results", 1000, 1, 50_000)
    found, after = reads.experiments(caller, _offset(fields), limit)
    return _page({"experiments": found}, after)


def search_runs(caller: Caller, fields: dict) -> dict:
    assert isinstance(caller, User)
    if text(fields, "filter", limit=1000) or text_list(fields, "order_by"):
        raise invalid("Starforge's search_runs takes no filter or order_by: newest job first")
    ids = text_list(fields, "experiment_ids")
    team_ids = [int(i) for i in ids if i.isdigit() and len(i) < 19]
    limit = integer(fields, "max_results", 1000, 1, 50_000)
    found, after = reads.runs(caller, team_ids, _offset(fields), limit)
    return _page({"runs": found}, after)


def metric_history(caller: Caller, fields: dict) -> dict:
    assert isinstance(caller, User)
    named = run_id_of(fields)
    metric = text(fields, "metric_key", required=True)
    key = reads.run_key(named)
    attempt = reads.readable_attempt(caller, *key) if key else None
    if attempt is None:
        raise missing(f"run {named!r}")
    limit = integer(fields, "max_results", 25_000, 1, 100_000)
    points, after = reads.history(
        attempt.job_id, attempt.number, str(metric), _offset(fields), limit
    )
    return _page({"metrics": points}, after)


def _reader(caller: Caller) -> User | None:
    """Whose rights a read is checked against; None for a tracking token, already held to its
    own run and team."""
    return None if isinstance(caller, TrackingPrincipal) else caller


def _may_see_team(caller: Caller, team_id: int) -> bool:
    return not isinstance(caller, TrackingPrincipal) or caller.row.job.team_id == team_id


def _offset(fields: dict) -> int:
    token = fields.get("page_token") or "0"
    if type(token) is not str or not token.isdigit() or len(token) > 18:
        raise invalid("'page_token' is not one this server gave")
    return int(token)


def _page(body: dict, after: int | None) -> dict:
    if after is not None:
        body["next_page_token"] = str(after)
    return body


POST, GET = ("POST",), ("GET", "POST")
ROUTES: dict[str, Route] = {
    "runs/create": Route(POST, create_run, job=True, user=False),
    "runs/update": Route(POST, update_run, job=True, user=False),
    "runs/log-metric": Route(POST, log_metric, job=True, user=False),
    "runs/log-parameter": Route(POST, log_param, job=True, user=False),
    "runs/set-tag": Route(POST, set_tag, job=True, user=False),
    "runs/log-batch": Route(POST, log_batch, job=True, user=False),
    "runs/log-inputs": Route(POST, log_inputs, job=True, user=False),
    "experiments/create": Route(POST, create_experiment, job=True, user=False),
    "runs/get": Route(GET, get_run, job=True, user=True),
    "experiments/get": Route(GET, get_experiment, job=True, user=True),
    "experiments/get-by-name": Route(GET, get_experiment_by_name, job=True, user=True),
    "runs/search": Route(POST, search_runs, job=False, user=True),
    "experiments/search": Route(GET, search_experiments, job=False, user=True),
    "metrics/get-history": Route(GET, metric_history, job=False, user=True),
}
