"""Hostile input that schemathesis's generators rarely or never send (NUL in a path, numbers past
bigint, JSON nested past Python's recursion limit, bodies and query strings past Django's caps):
each is refused with a 4xx and a sentence, never a 500.
"""

import json

import pytest
from django.test import Client
from django.utils import timezone

from jobs.actions.tokens import create_token
from jobs.job_tokens import job_token
from jobs.models import MetricChunk
from jobs.states import JobStatus
from jobs.stores.metrics.ingest import TRACKING_SEQ_BASE
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
DEEP = "[" * 100_000
MANY_FIELDS = "&".join(f"f{i}=1" for i in range(1200))  # past DATA_UPLOAD_MAX_NUMBER_FIELDS


def point(**fields) -> dict:
    return {"seq": 0, "kind": "train", "name": "loss", "step": 1, "value": 0.5, "ts": 1.0, **fields}


@pytest.fixture
def clients(make_team, make_user) -> dict:
    team = make_team("vision")
    alice = make_user("alice", team)
    ada = make_user("ada", team, role="admin")
    job = queued_job(team, alice)
    with_attempt(job, JobStatus.RUNNING, start_time=timezone.now())
    return {
        "member": Client(HTTP_AUTHORIZATION=f"Bearer {create_token(alice, 't')[1]}"),
        "admin": Client(HTTP_AUTHORIZATION=f"Bearer {create_token(ada, 't')[1]}"),
        "runner": Client(HTTP_AUTHORIZATION=f"Bearer {job_token(job.pk, 1)}"),
        "job_id": job.pk,
    }


def send(client: Client, method: str, url: str, body=None):
    if body is None:
        return getattr(client, method)(url)
    raw = body if isinstance(body, str) else json.dumps(body)
    return getattr(client, method)(url, raw, content_type="application/json")


@pytest.mark.parametrize(
    "who, method, url, body, status, sentence",
    [
        ("member", "get", "/teams/vi%00sion", None, 422, "NUL"),
        ("admin", "patch", "/teams/vi%00sion", {}, 422, "NUL"),
        ("admin", "patch", "/teams/vision/members/a%00b", {"role": "member"}, 422, "NUL"),
        ("admin", "delete", "/teams/vision/members/a%00b", None, 422, "NUL"),
        ("runner", "post", "/ingest/logs", DEEP, 400, "nested too deeply"),
        ("runner", "post", "/ingest/metrics", DEEP, 400, "nested too deeply"),
        ("runner", "post", "/ingest/started", DEEP, 400, "nested too deeply"),
        ("member", "post", "/jobs", {"entrypoint": ["x" * 4000] * 1000}, 413, "request body"),
        ("admin", "patch", "/teams/vision", {"window": "x" * 3_000_000}, 413, "request body"),
        ("member", "get", f"/jobs?{MANY_FIELDS}", None, 400, "DATA_UPLOAD_MAX_NUMBER_FIELDS"),
        ("member", "get", f"/usage?{MANY_FIELDS}", None, 400, "DATA_UPLOAD_MAX_NUMBER_FIELDS"),
    ],
)
def test_hostile_request_is_refused_with_a_sentence(
    clients, who, method, url, body, status, sentence
):
    response = send(clients[who], method, f"/api/v1{url}", body)
    assert response.status_code == status, response.content[:300]
    assert sentence in response.json()["detail"]


@pytest.mark.parametrize(
    "bad",
    [
        point(seq=2**63),
        point(step=2**63),
        point(name="lo\x00ss"),
        point(value=10**400),
        point(ts=-(10**400)),
    ],
    ids=["seq-past-bigint", "step-past-bigint", "nul-in-name", "huge-int-value", "huge-int-ts"],
)
def test_metric_point_the_ledger_cannot_hold_is_refused(clients, bad):
    body = {"attempt": 1, "points": [bad]}
    response = send(clients["runner"], "post", "/api/v1/ingest/metrics", body)
    assert response.status_code == 400, response.content[:300]
    assert "point 0 must have" in response.json()["detail"]
    assert not MetricChunk.objects.exists()


def test_the_runners_largest_seq_and_a_bigint_step_are_stored(clients):
    """The runner's seqs stop below MLflow's range (`TRACKING_SEQ_BASE`), which the server
    numbers itself; a step may be any bigint."""
    body = {"attempt": 1, "points": [point(seq=TRACKING_SEQ_BASE - 1, step=2**63 - 1)]}
    response = send(clients["runner"], "post", "/api/v1/ingest/metrics", body)
    assert response.status_code == 200, response.content[:300]
    assert response.json()["accepted"] == 1
    body = {"attempt": 1, "points": [point(seq=TRACKING_SEQ_BASE)]}
    response = send(clients["runner"], "post", "/api/v1/ingest/metrics", body)
    assert response.status_code == 400, response.content[:300]
