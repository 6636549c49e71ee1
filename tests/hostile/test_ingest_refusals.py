"""The runner's ingest under hostile tokens and bodies: every endpoint, every kind of refusal.

A job token is bound to one job and one attempt: whatever the body or the query string names,
writes land only where the token says, and a token that may no longer write is refused with a
sentence while the ledger stays as it was.
"""

import datetime as dt
import gzip
import io
import json
import tarfile
from dataclasses import dataclass

import pytest
from django.core import signing
from django.test import Client
from django.utils import timezone

from jobs.api.ingest import INGEST_GRACE_S
from jobs.job_tokens import BOOTSTRAP_SALT, JOB_TOKEN_SALT, job_token
from jobs.models import Attempt, Job, JobEvent, LogStream
from jobs.stores import logstore
from jobs.stores.metrics import chunks
from tests.api_helpers import assert_refused, submit
from tests.ingesting import attach_attempt

pytestmark = pytest.mark.django_db
T0 = 1_700_000_000.0


def log_body(attempt: int, count: int = 2, text: str = "line") -> dict:
    lines = [{"seq": s, "stream": "stdout", "ts": T0 + s, "text": text} for s in range(count)]
    return {"attempt": attempt, "lines": lines}


def metric_body(attempt: int, count: int = 2) -> dict:
    points = [
        {"seq": s, "kind": "train", "name": "loss", "step": s, "value": 0.5, "ts": T0 + s}
        for s in range(count)
    ]
    return {"attempt": attempt, "points": points}


@dataclass(frozen=True)
class Endpoint:
    path: str
    method: str  # "post" sends a JSON body; "get" sends none
    body: object  # attempt number -> body
    cap_setting: str | None = None  # the batch's item cap, when it has one

    def call(self, client: Client, attempt: int, query: str = "", body=None):
        url = f"/api/v1/ingest/{self.path}{query}"
        if self.method == "get":
            return client.get(url)
        payload = body if body is not None else json.dumps(self.body(attempt))
        return client.post(url, payload, content_type="application/json")


ENDPOINTS = [
    Endpoint("logs", "post", log_body, "SF_LOG_BATCH_MAX_LINES"),
    Endpoint("metrics", "post", metric_body, "SF_METRIC_BATCH_MAX_POINTS"),
    Endpoint("started", "post", lambda attempt: {"attempt": attempt}),
    Endpoint("snapshot", "get", lambda attempt: None),
]
WRITERS = [e for e in ENDPOINTS if e.method == "post"]
ids = [e.path for e in ENDPOINTS]


def ledger(job_id: int) -> tuple:
    """Everything an ingest could change about a job."""
    job = Job.objects.filter(pk=job_id).values("status", "status_reason", "attempt_count").get()
    attempts = list(
        Attempt.objects.filter(job_id=job_id).order_by("number").values_list("number", "start_time")
    )
    streams = list(LogStream.objects.filter(job_id=job_id).values_list("attempt", "next_seq"))
    lines = logstore.read(job_id, None, 10_000).raw_lines
    points = len(chunks.stored_points(job_id))
    return job, attempts, JobEvent.objects.filter(job_id=job_id).count(), streams, lines, points


def runner(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def snapshot_of(api, text: bytes) -> str:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    body = gzip.compress(raw.getvalue(), mtime=0)
    response = api.client.post("/api/v1/snapshots", body, content_type="application/gzip")
    assert response.status_code == 201, response.content
    return response.json()["sha256"]


@pytest.fixture
def jobs(api) -> tuple[int, int]:
    """Two RUNNING jobs of the same user, each on attempt 1, each with its own snapshot."""
    first = submit(api, snapshot=snapshot_of(api, b"print('first')\n"))
    second = submit(api, snapshot=snapshot_of(api, b"print('second')\n"))
    attach_attempt(first, 1)
    attach_attempt(second, 1)
    return first, second


# -- a token writes only where it says -------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=ids)
def test_another_jobs_token_touches_only_its_own_job_whatever_the_request_names(jobs, endpoint):
    mine, other = jobs
    before = ledger(mine)
    # The query string names the other job and attempt; the body's attempt is the token's.
    query = f"?job_id={mine}&job={mine}&attempt=1&run_id=x"
    response = endpoint.call(runner(job_token(other, 1)), 1, query)
    assert response.status_code == 200, response.content
    assert ledger(mine) == before
    if endpoint.path == "snapshot":
        assert b"second" in gzip.decompress(b"".join(response.streaming_content))
    elif endpoint.path == "started":
        assert Attempt.objects.get(job_id=other, number=1).start_time is not None
    else:
        assert ledger(other) != before


@pytest.mark.parametrize("endpoint", WRITERS, ids=[e.path for e in WRITERS])
def test_a_body_naming_another_job_or_attempt_is_refused_or_ignored(jobs, endpoint):
    mine, other = jobs
    body = {**endpoint.body(2), "job_id": mine, "job": mine}
    before = ledger(mine), ledger(other)
    response = endpoint.call(runner(job_token(other, 1)), 1, body=json.dumps(body))
    assert_refused(response, 400, '"attempt": 1')
    assert (ledger(mine), ledger(other)) == before


# -- tokens that may not write ---------------------------------------------------------------------


def forged_tokens(job_id: int) -> dict[str, str]:
    real = job_token(job_id, 1)
    payload = real.rsplit(":", 1)[0]
    other_key = signing.Signer(key="not-the-secret-key", salt=JOB_TOKEN_SALT)
    return {
        "bad signature": real[:-2] + ("xx" if not real.endswith("xx") else "yy"),
        "another key": other_key.sign(payload),
        "another salt": signing.Signer().sign(payload),
        "job id swapped": f"{job_id + 1}." + real.split(".", 1)[1],
        "unsigned": payload,
        "empty signature": f"{payload}:",
        "not a job": signing.Signer(salt=JOB_TOKEN_SALT).sign("admin"),
        # Signed with the installation's own key, but without the attempt's nonce: the old
        # token format, or a token made by someone who holds the key and not the ledger.
        "signed without the nonce": signing.Signer(salt=JOB_TOKEN_SALT).sign(f"{job_id}.1"),
        "another nonce": signing.Signer(salt=JOB_TOKEN_SALT).sign(f"{job_id}.1.{'0' * 32}"),
        "a bootstrap credential": signing.Signer(salt=BOOTSTRAP_SALT).sign(payload),
    }


FORGERIES = [
    "a bootstrap credential",
    "another key",
    "another nonce",
    "another salt",
    "bad signature",
    "empty signature",
    "job id swapped",
    "not a job",
    "signed without the nonce",
    "unsigned",
]


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=ids)
@pytest.mark.parametrize("kind", FORGERIES)
def test_a_forged_token_is_401_and_writes_nothing(jobs, endpoint, kind):
    mine, _ = jobs
    before = ledger(mine)
    response = endpoint.call(runner(forged_tokens(mine)[kind]), 1)
    assert_refused(response, 401, "token")
    assert ledger(mine) == before


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=ids)
def test_a_job_finished_past_the_grace_is_410(jobs, endpoint):
    mine, _ = jobs
    ended = timezone.now() - dt.timedelta(seconds=INGEST_GRACE_S + 1)
    Job.objects.filter(pk=mine).update(status="SUCCEEDED", status_changed_at=ended)
    before = ledger(mine)
    assert_refused(endpoint.call(runner(job_token(mine, 1)), 1), 410, "closed")
    assert ledger(mine) == before


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=ids)
def test_a_token_of_an_attempt_that_is_not_current_is_410(jobs, endpoint):
    mine, _ = jobs
    attach_attempt(mine, 2)
    before = ledger(mine)
    assert_refused(endpoint.call(runner(job_token(mine, 1)), 1), 410, "attempt 1")
    assert ledger(mine) == before


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=ids)
def test_a_user_token_cannot_ingest(api, jobs, endpoint):
    mine, _ = jobs
    before = ledger(mine)
    assert_refused(endpoint.call(api.client, 1), 401)
    assert ledger(mine) == before


# -- oversized batches -----------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", [e for e in WRITERS if e.cap_setting], ids=["logs", "metrics"])
def test_a_batch_over_the_item_cap_is_413(jobs, endpoint, settings):
    mine, _ = jobs
    setattr(settings, endpoint.cap_setting, 3)
    before = ledger(mine)
    body = json.dumps(endpoint.body(1, count=4))
    assert_refused(endpoint.call(runner(job_token(mine, 1)), 1, body=body), 413, "at most 3")
    assert ledger(mine) == before


@pytest.mark.parametrize("endpoint", WRITERS, ids=[e.path for e in WRITERS])
def test_a_body_over_the_byte_cap_is_413(jobs, endpoint, settings):
    mine, _ = jobs
    settings.SF_INGEST_MAX_BODY_BYTES = 4096
    before = ledger(mine)
    body = endpoint.body(1)
    body["padding"] = "x" * 5000
    response = endpoint.call(runner(job_token(mine, 1)), 1, body=json.dumps(body))
    assert_refused(response, 413, "bytes")
    assert ledger(mine) == before


def test_a_log_batch_of_long_lines_over_djangos_own_cap_is_stored_not_a_500(jobs):
    mine, _ = jobs
    body = json.dumps(log_body(1, count=20, text="y" * 200_000))  # 4 MB
    response = ENDPOINTS[0].call(runner(job_token(mine, 1)), 1, body=body)
    assert response.status_code == 200, response.content
    assert response.json()["accepted"] == 20


def test_a_body_declaring_a_length_over_the_cap_is_413_before_it_is_read(jobs, settings):
    mine, _ = jobs
    settings.SF_INGEST_MAX_BODY_BYTES = 4096
    client = runner(job_token(mine, 1))
    response = client.post(
        "/api/v1/ingest/logs",
        json.dumps(log_body(1)),
        content_type="application/json",
        CONTENT_LENGTH="999999999",
    )
    assert_refused(response, 413, "at most 4096 bytes")
