"""Starforge's MLflow routes over HTTP (Django's test client): MLflow's error shape for every
refusal, the checks on what a job's code sends, the cap, and the seqs kept apart from the
runner's."""

import json

import pytest

from jobs.models import JobEvent, TrackingValue
from jobs.stores.metrics.chunks import stored_points
from jobs.stores.metrics.ingest import TRACKING_SEQ_BASE
from tests.factories import queued_job, with_attempt
from tests.ingesting import make_points, runner, send_points
from tests.mlflow_calls import token_of

pytestmark = pytest.mark.django_db

ROOT = "/mlflow/api/2.0/mlflow"


@pytest.fixture
def job(team, alice):
    job = queued_job(team, alice)
    with_attempt(job, "RUNNING")
    return job


def call(client, path, body=None, token=None, method="post"):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    if method == "get":
        return client.get(path, body or {}, **headers)
    raw = body if isinstance(body, str | bytes) else json.dumps(body or {})
    return getattr(client, method)(path, raw, content_type="application/json", **headers)


def refused(response, status: int, code: str) -> str:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error_code"] == code
    return body["message"]


def metric(key="loss", value=1.0, step=0, timestamp=1_700_000_000_000):
    return {"key": key, "value": value, "step": step, "timestamp": timestamp}


@pytest.mark.parametrize(
    "path",
    [
        "/mlflow/api/2.0/mlflow-artifacts/artifacts/model.pkl",
        "/mlflow/api/2.0/mlflow/registered-models/create",
        "/mlflow/api/3.0/mlflow/traces",
        "/mlflow/ajax-api/2.0/mlflow/runs/search",
        "/mlflow/version",
        "/mlflow/",
    ],
)
def test_a_route_not_served_answers_mlflows_endpoint_not_found(client, job, path):
    for token in (None, token_of(job.pk)):
        message = refused(call(client, path, token=token), 404, "ENDPOINT_NOT_FOUND")
        assert "does not serve" in message


def test_a_route_called_with_the_wrong_method_says_which_it_takes(client, job):
    message = refused(
        call(client, f"{ROOT}/runs/log-batch", token=token_of(job.pk), method="get"),
        405,
        "ENDPOINT_NOT_FOUND",
    )
    assert "takes POST" in message


def test_no_credential_is_unauthenticated_in_mlflows_shape(client, job):
    response = call(client, f"{ROOT}/runs/get", {"run_id": f"{job.pk}-1"}, method="get")
    assert "send a job's MLFLOW_TRACKING_TOKEN" in refused(response, 401, "UNAUTHENTICATED")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ({"metrics": "loss"}, "'metrics' must be a list"),
        ({"metrics": [metric(value="NaN")]}, "finite values only"),
        ({"metrics": [metric(value="-Infinity")]}, "finite values only"),
        ({"metrics": [metric(key="x" * 101)]}, "1 to 100 characters"),
        ({"metrics": [metric(key="a\u0000b")]}, "without NUL"),
        ({"metrics": [metric(step=-1)]}, "'step' must be an integer"),
        ({"metrics": [metric(value=True)]}, "must be a number"),
        ({"metrics": [metric(timestamp="soon")]}, "'timestamp' must be an integer"),
        ({"metrics": [metric()] * 1001}, "at most 1000 metrics"),
        ({"params": [{"key": "lr", "value": "x" * 6001}]}, "at most 6000"),
        ({"params": [{"value": "1"}]}, "'key'"),
        ({"tags": [{"key": "k" * 251, "value": "1"}]}, "at most 250"),
    ],
)
def test_a_batch_starforge_cannot_keep_is_refused_whole_with_a_sentence(client, job, body, says):
    if isinstance(body, dict):
        body = {"run_id": f"{job.pk}-1", **body}
    response = call(client, f"{ROOT}/runs/log-batch", body, token=token_of(job.pk))
    assert says in refused(response, 400, "INVALID_PARAMETER_VALUE")
    assert stored_points(job.pk) == []
    assert not TrackingValue.objects.filter(job=job).exists()


def test_a_param_keeps_its_first_value_as_in_mlflow(client, job):
    token, run = token_of(job.pk), f"{job.pk}-1"
    path = f"{ROOT}/runs/log-parameter"
    assert call(client, path, {"run_id": run, "key": "lr", "value": "0.1"}, token).json() == {}
    assert (
        call(client, path, {"run_id": run, "key": "lr", "value": "0.1"}, token).status_code == 200
    )

    response = call(client, path, {"run_id": run, "key": "lr", "value": "0.2"}, token)

    assert "keeps its first value" in refused(response, 400, "INVALID_PARAMETER_VALUE")
    assert list(TrackingValue.objects.values_list("key", "value")) == [("lr", "0.1")]


def test_tags_keep_their_last_value(client, job):
    token, run = token_of(job.pk), f"{job.pk}-1"
    for value in ("a", "b"):
        call(client, f"{ROOT}/runs/set-tag", {"run_id": run, "key": "stage", "value": value}, token)
    assert list(TrackingValue.objects.values_list("kind", "key", "value")) == [
        ("tag", "stage", "b")
    ]


def test_mlflow_points_and_the_runners_never_collide(client, job):
    assert send_points(runner(job.pk), make_points(0, 10)).status_code == 200
    body = {"run_id": f"{job.pk}-1", "metrics": [metric(step=s) for s in range(10)]}

    assert call(client, f"{ROOT}/runs/log-batch", body, token_of(job.pk)).status_code == 200
    assert send_points(runner(job.pk), make_points(10, 15)).status_code == 200
    assert call(client, f"{ROOT}/runs/log-batch", body, token_of(job.pk)).status_code == 200

    seqs = [p[1] for p in stored_points(job.pk)]
    assert seqs == [*range(15), *range(TRACKING_SEQ_BASE, TRACKING_SEQ_BASE + 20)]


def test_the_runner_cannot_send_a_seq_in_mlflows_range(job):
    point = make_points(0, 1)[0] | {"seq": TRACKING_SEQ_BASE}
    response = send_points(runner(job.pk), [point])
    assert response.status_code == 400
    assert f"seq is below {TRACKING_SEQ_BASE}" in response.json()["detail"]


def test_the_attempts_metric_cap_holds_for_mlflow_points(client, job, settings):
    settings.SF_ATTEMPT_MAX_METRIC_POINTS = 12
    send_points(runner(job.pk), make_points(0, 5))
    body = {"run_id": f"{job.pk}-1", "metrics": [metric(step=s) for s in range(10)]}

    assert call(client, f"{ROOT}/runs/log-batch", body, token_of(job.pk)).status_code == 200
    assert call(client, f"{ROOT}/runs/log-batch", body, token_of(job.pk)).status_code == 200

    assert len(stored_points(job.pk)) == 12
    notes = JobEvent.objects.filter(job=job, data__limit="metric_points")
    assert notes.count() == 1


def test_a_metric_history_comes_in_pages(client, job, alice):
    from jobs.actions.tokens import issue_token

    body = {"run_id": f"{job.pk}-1", "metrics": [metric(step=s, value=s) for s in range(5)]}
    call(client, f"{ROOT}/runs/log-batch", body, token_of(job.pk))
    query = {"run_id": f"{job.pk}-1", "metric_key": "loss", "max_results": 2}
    steps, token, pages = [], None, 0
    while True:
        page = call(
            client,
            f"{ROOT}/metrics/get-history",
            query | ({"page_token": token} if token else {}),
            issue_token(alice),
            "get",
        ).json()
        steps += [m["step"] for m in page["metrics"]]
        pages += 1
        token = page.get("next_page_token")
        if token is None:
            break
    assert (steps, pages) == ([0, 1, 2, 3, 4], 3)
