"""MLflow's REST wire format for Starforge's tracking endpoint (`jobs.api.mlflow`): the errors
MLflow's client understands, a request's fields read and checked, and the JSON of experiments,
runs and metrics.

MLflow's client reads a failed call's `{"error_code", "message"}` and raises it as a
`RestException`; it retries 429 and 5xx, so nothing a request sends may end in a 5xx. The
shapes follow MLflow's `service.proto` (3.18): int64 fields as JSON numbers, as MLflow's own
server writes them.
"""

import math
from dataclasses import dataclass
from typing import Any, cast

import orjson
from django.http import HttpRequest, HttpResponse

from jobs.models import BIGINT_MAX, MetricKind
from jobs.stores.metrics.ingest import MAX_NAME

# MLflow's own limits (mlflow/utils/validation.py), held to here too.
MAX_KEY = 250
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_BATCH_METRICS = 1000
MAX_BATCH_PARAMS_TAGS = 100
MAX_BODY_BYTES = 4 * 1024 * 1024
# A metric named so goes to the job's Validation charts; any other to its train charts.
VALIDATION_PREFIXES = ("val_", "eval_", "validation_", "val/", "eval/", "validation/")

STATUS_OF = {
    "INVALID_PARAMETER_VALUE": 400,
    "BAD_REQUEST": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "RESOURCE_DOES_NOT_EXIST": 404,
    "ENDPOINT_NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "REQUEST_LIMIT_EXCEEDED": 429,
}


class MlflowError(Exception):
    """A refusal in MLflow's shape: its error code (which sets the status) and a sentence."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.http_status = status or STATUS_OF[code]


def invalid(message: str) -> MlflowError:
    return MlflowError("INVALID_PARAMETER_VALUE", message)


def missing(what: str) -> MlflowError:
    """The one answer for a run or experiment that does not exist and for one the caller may not
    read: no existence oracle."""
    return MlflowError("RESOURCE_DOES_NOT_EXIST", f"{what} does not exist")


def answer(body: dict, status: int = 200) -> HttpResponse:
    return HttpResponse(orjson.dumps(body), status=status, content_type="application/json")


def error_answer(error: MlflowError) -> HttpResponse:
    response = answer({"error_code": error.code, "message": error.message}, error.http_status)
    if error.http_status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


def request_fields(request: HttpRequest) -> dict[str, Any]:
    """A request's fields: its JSON object (POST, PATCH) or its query (GET, lists repeated)."""
    if request.method == "GET":
        return {
            key: values if len(values) > 1 else values[0] for key, values in request.GET.lists()
        }
    length = request.headers.get("Content-Length", "")
    body = (
        b""
        if length.isdigit() and int(length) > MAX_BODY_BYTES
        else request.read(MAX_BODY_BYTES + 1)
    )
    if len(body) > MAX_BODY_BYTES or (length.isdigit() and int(length) > MAX_BODY_BYTES):
        raise MlflowError(
            "INVALID_PARAMETER_VALUE", f"a request is at most {MAX_BODY_BYTES} bytes", 413
        )
    if not body.strip():
        return {}
    try:
        fields = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"the body is not JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise invalid("the body must be a JSON object")
    return fields


def text(fields: dict, name: str, *, required: bool = False, limit: int = MAX_KEY) -> str | None:
    """Field `name` as a string (no NUL, at most `limit` characters), or None when absent."""
    value = fields.get(name)
    if value is None or value == "":
        if required:
            raise invalid(f"missing value for required parameter '{name}'")
        return None
    if type(value) is not str or "\x00" in value or len(value) > limit:
        raise invalid(f"'{name}' must be a string of at most {limit} characters without NUL")
    return value


def integer(fields: dict, name: str, default: int, low: int = 0, high: int = BIGINT_MAX) -> int:
    """Field `name` as an int in [low, high] (a JSON number or a decimal string, as proto
    JSON writes int64), or `default` when absent."""
    value = fields.get(name)
    if value is None or value == "":
        return default
    if type(value) is str and value.lstrip("-").isdigit():
        value = int(value)
    if type(value) is not int or not low <= value <= high:
        raise invalid(f"'{name}' must be an integer from {low} to {high}")
    return value


def text_list(fields: dict, name: str) -> list[str]:
    value = fields.get(name, [])
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(type(v) is str for v in value):
        raise invalid(f"'{name}' must be a list of strings")
    return value


def run_id_of(fields: dict) -> str:
    """The run a request names (`run_id`, or the older `run_uuid`)."""
    run_id = text(fields, "run_id") or text(fields, "run_uuid")
    if run_id is None:
        raise invalid("missing value for required parameter 'run_id'")
    return run_id


def metric_kind(name: str) -> str:
    """The kind a metric of this name is stored as: validation for `val_`, `eval_` or
    `validation_` names (and their `/` spellings), train for any other."""
    lowered = name.lower()
    if lowered.startswith(VALIDATION_PREFIXES):
        return MetricKind.VALIDATION
    return MetricKind.TRAIN


@dataclass
class MetricColumns:
    """MLflow metrics as the store's columns (`jobs.stores.metrics.ingest.append_tracked`)."""

    kind: list[str]
    name: list[str]
    step: list[int]
    value: list[float]
    ts: list[float]


def metric_columns(items: Any) -> MetricColumns:
    """MLflow `Metric` objects ({key, value, timestamp (ms), step}) checked into columns, or
    INVALID_PARAMETER_VALUE naming the first that Starforge cannot keep.

    `log_batch`'s hot loop: a metric as MLflow's client sends it (a known key, a finite float,
    int step and timestamp in range) is checked inline, its key's checks and kind done once per
    key; anything else goes through the field checkers, which accept what they accept and word
    the refusal."""
    if not isinstance(items, list):
        raise invalid("'metrics' must be a list")
    if len(items) > MAX_BATCH_METRICS:
        raise invalid(f"a batch holds at most {MAX_BATCH_METRICS} metrics, not {len(items)}")
    kinds: dict[str, str] = {}  # key -> kind, for keys already checked
    out = MetricColumns([], [], [], [], [])
    isfinite = math.isfinite
    for i, item in enumerate(items):
        if type(item) is not dict:
            raise invalid(f"metric {i} must be an object")
        key, value, step = item.get("key"), item.get("value"), item.get("step")
        kind = kinds.get(key) if type(key) is str else None
        if kind is None:  # a key not seen yet: checked (and refused) by the field checker
            key = _metric_key(item, i)
            kind = kinds[key] = metric_kind(key)
        if not (type(value) is float and isfinite(value)):
            value = _metric_value(item, i)
        if not (type(step) is int and 0 <= step <= BIGINT_MAX):
            step = integer(item, "step", 0)
        stamp = item.get("timestamp")
        if type(stamp) is int and 0 <= stamp <= BIGINT_MAX:
            ts: float = stamp / 1000
        else:
            ts = integer(item, "timestamp", 0) / 1000
        out.kind.append(kind)
        out.name.append(cast(str, key))  # a key of `kinds`: checked
        out.step.append(step)
        out.value.append(value)
        out.ts.append(ts)
    return out


def _metric_key(item: dict, i: int) -> str:
    key = item.get("key")
    if type(key) is not str or not 0 < len(key) <= MAX_NAME or "\x00" in key:
        raise invalid(
            f"metric {i}: 'key' must be a name of 1 to {MAX_NAME} characters without NUL "
            "(Starforge's limit for a series name)"
        )
    return key


def _metric_value(item: dict, i: int) -> float:
    value = item.get("value")
    if type(value) is str:  # proto JSON writes NaN and the infinities as strings
        try:
            value = float(value)
        except ValueError:
            raise invalid(f"metric {i}: 'value' must be a number") from None
    if not isinstance(value, int | float) or type(value) is bool:
        raise invalid(f"metric {i}: 'value' must be a number")
    try:
        number = float(value)
    except OverflowError:
        raise invalid(f"metric {i}: 'value' is out of a float's range") from None
    if not math.isfinite(number):
        raise invalid(
            f"metric {i} ({item.get('key')!r}): Starforge keeps finite values only, not {number}"
        )
    return number


def key_values(items: Any, what: str, limit: int) -> dict[str, str]:
    """MLflow params or tags ({key, value}) checked, in order (a key sent twice keeps its last
    value)."""
    if not isinstance(items, list):
        raise invalid(f"'{what}' must be a list")
    if len(items) > MAX_BATCH_PARAMS_TAGS:
        raise invalid(f"a batch holds at most {MAX_BATCH_PARAMS_TAGS} {what}, not {len(items)}")
    out: dict[str, str] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid(f"{what} {i} must be an object")
        key = text(item, "key", required=True)
        value = item.get("value", "")
        if type(value) is not str or "\x00" in value or len(value) > limit:
            raise invalid(
                f"{what} {i} ({key!r}): 'value' must be a string of at most {limit} "
                "characters without NUL"
            )
        out[str(key)] = value
    return out


def metric_json(key: str, step: int, value: float, ts: float) -> dict:
    return {"key": key, "value": value, "timestamp": round(ts * 1000), "step": step}
