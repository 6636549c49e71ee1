"""The MLflow tracking token a job's code holds adds to its own attempt and nothing else, and
dies with it; the MLflow routes take no other job credential; a user's token reads only their
teams' runs, as if the others did not exist, and writes nothing."""

import datetime as dt
import json

import pytest
from django.test import Client
from django.utils import timezone

from jobs.actions.tokens import issue_token
from jobs.job_tokens import job_token
from jobs.models import Attempt, Job
from jobs.stores.metrics.chunks import stored_points
from tests.factories import queued_job, with_attempt
from tests.ingesting import make_points, send_points
from tests.mlflow_calls import token_of

pytestmark = pytest.mark.django_db

ROOT = "/mlflow/api/2.0/mlflow"


@pytest.fixture
def job(team, alice):
    job = queued_job(team, alice)
    with_attempt(job, "RUNNING")
    return job


@pytest.fixture
def other_job(make_team, make_user):
    team = make_team("audio")
    job = queued_job(team, make_user("bob", team))
    with_attempt(job, "RUNNING")
    return job


def post(path, body, token):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client.post(f"{ROOT}/{path}", json.dumps(body), content_type="application/json")


def get(path, query, token):
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(f"{ROOT}/{path}", query)


def code_of(response) -> tuple[int, str]:
    return response.status_code, response.json()["error_code"]


def log_one(job_id: int, attempt: int, token: str):
    metric = {"key": "loss", "value": 1.0, "step": 0, "timestamp": 0}
    return post("runs/log-batch", {"run_id": f"{job_id}-{attempt}", "metrics": [metric]}, token)


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("runs/search", {"experiment_ids": ["1"]}),
        ("metrics/get-history", {"run_id": "1-1", "metric_key": "loss"}),
        ("experiments/search", {}),
    ],
)
def test_a_tracking_token_reads_nothing(job, path, query):
    query = {
        k: v.replace("1-1", f"{job.pk}-1") if isinstance(v, str) else v for k, v in query.items()
    }
    assert code_of(post(path, query, token_of(job.pk))) == (403, "PERMISSION_DENIED")


def test_a_tracking_token_sees_no_other_run_or_experiment(job, other_job):
    token = token_of(job.pk)
    for response in (
        get("runs/get", {"run_id": f"{other_job.pk}-1"}, token),
        get("experiments/get", {"experiment_id": str(other_job.team_id)}, token),
        get("experiments/get-by-name", {"experiment_name": "audio"}, token),
    ):
        assert code_of(response) == (404, "RESOURCE_DOES_NOT_EXIST")
    assert get("runs/get", {"run_id": f"{job.pk}-1"}, token).status_code == 200


def test_a_tracking_token_cannot_write_another_job_or_attempt(job, other_job):
    token = token_of(job.pk)
    for job_id, attempt in ((other_job.pk, 1), (job.pk, 2)):
        assert code_of(log_one(job_id, attempt, token)) == (404, "RESOURCE_DOES_NOT_EXIST")
        response = post(
            "runs/log-parameter", {"run_id": f"{job_id}-{attempt}", "key": "a", "value": "b"}, token
        )
        assert code_of(response) == (404, "RESOURCE_DOES_NOT_EXIST")
    assert stored_points(job.pk) == stored_points(other_job.pk) == []


def test_a_tracking_token_dies_with_its_attempt_after_a_retry(job):
    old = token_of(job.pk, 1)
    assert log_one(job.pk, 1, old).status_code == 200
    job.refresh_from_db()
    with_attempt(job, "RUNNING")  # the retry's attempt 2 is current now

    assert code_of(log_one(job.pk, 1, old)) == (401, "UNAUTHENTICATED")
    assert log_one(job.pk, 2, token_of(job.pk, 2)).status_code == 200


def test_a_tracking_token_dies_past_the_ingest_grace(job):
    token = token_of(job.pk)
    ended = timezone.now() - dt.timedelta(seconds=60)
    Job.objects.filter(pk=job.pk).update(status="SUCCEEDED", status_changed_at=ended)
    assert log_one(job.pk, 1, token).status_code == 200  # the last flush, within the grace

    Job.objects.filter(pk=job.pk).update(status_changed_at=ended - dt.timedelta(seconds=90))
    response = log_one(job.pk, 1, token)
    assert code_of(response) == (401, "UNAUTHENTICATED")
    assert "is over" in response.json()["message"]


def test_a_tracking_token_of_an_old_nonce_or_forged_is_refused(job):
    token = token_of(job.pk)
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    assert code_of(log_one(job.pk, 1, forged)) == (401, "UNAUTHENTICATED")
    Attempt.objects.filter(job=job).update(token_nonce="f" * 32)
    assert code_of(log_one(job.pk, 1, token)) == (401, "UNAUTHENTICATED")


def test_the_tracking_token_opens_no_other_route(job):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token_of(job.pk)}")
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get(f"/api/v1/jobs/{job.pk}/metrics").status_code == 401
    assert send_points(client, make_points(0, 1)).status_code == 401


def test_the_mlflow_routes_take_no_job_or_bootstrap_token(job):
    from jobs.job_tokens import bootstrap_token_for

    attempt = Attempt.objects.get(job=job)
    for token in (job_token(job.pk, 1), bootstrap_token_for(attempt)):
        assert code_of(log_one(job.pk, 1, token)) == (401, "UNAUTHENTICATED")


def test_unknown_tracking_tokens_are_throttled_by_address(job, settings):
    limit = settings.SF_TOKEN_MAX_FAILURES
    for _ in range(limit):
        assert log_one(job.pk, 1, f"sft.{job.pk}.1.{'0' * 64}").status_code == 401
    assert code_of(log_one(job.pk, 1, f"sft.{job.pk}.1.{'1' * 64}")) == (
        429,
        "REQUEST_LIMIT_EXCEEDED",
    )
    assert log_one(job.pk, 1, token_of(job.pk)).status_code == 200  # a valid one still served


def test_another_teams_runs_and_experiments_do_not_exist_for_a_member(job, other_job, alice):
    token = issue_token(alice)
    missing_run = get("runs/get", {"run_id": "999999-1"}, token)
    for response in (
        get("runs/get", {"run_id": f"{other_job.pk}-1"}, token),
        get("metrics/get-history", {"run_id": f"{other_job.pk}-1", "metric_key": "loss"}, token),
        get("experiments/get", {"experiment_id": str(other_job.team_id)}, token),
        get("experiments/get-by-name", {"experiment_name": "audio"}, token),
    ):
        assert code_of(response) == code_of(missing_run) == (404, "RESOURCE_DOES_NOT_EXIST")
    searched = post("runs/search", {"experiment_ids": [str(other_job.team_id)]}, token)
    assert searched.json() == {"runs": []}
    mine = post("runs/search", {"experiment_ids": [str(job.team_id)]}, token).json()
    assert [run["info"]["run_id"] for run in mine["runs"]] == [f"{job.pk}-1"]


@pytest.mark.parametrize(
    "path", ["runs/create", "runs/log-batch", "runs/set-tag", "runs/update", "experiments/create"]
)
def test_a_user_token_writes_nothing(job, alice, path):
    response = post(
        path, {"run_id": f"{job.pk}-1", "experiment_id": "0", "name": "x"}, issue_token(alice)
    )
    assert code_of(response) == (403, "PERMISSION_DENIED")


def test_a_console_session_is_no_credential_here(job, alice):
    """MLflow's routes take bearer tokens only: a signed-in browser's cookie reads and writes
    nothing (so a page of another site cannot make a member's browser log into a run)."""
    browser = Client()
    browser.force_login(alice)
    read = browser.get(f"{ROOT}/runs/get", {"run_id": f"{job.pk}-1"})
    assert read.status_code == 401, read.content
    body = {"run_id": f"{job.pk}-1", "key": "loss", "value": 1.0, "step": 0, "timestamp": 0}
    written = browser.post(f"{ROOT}/runs/log-metric", json.dumps(body), "application/json")
    assert written.status_code == 401, written.content
    assert written.json()["error_code"] == "UNAUTHENTICATED"
