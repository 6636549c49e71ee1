"""Every operation of the API's own OpenAPI schema, driven by schemathesis with valid and invalid
input: no answer is a 5xx, and every answer is one the schema documents (status code,
content type, body).

Users' operations run with a normal user's API token: alice, a member (not staff, not a team
admin) of a team with a cluster, jobs in several states, logs, metrics and a second token. The
team operations run again as ada, the team's admin (also not staff), since alice only ever gets
403 there. The runner's ingest operations run in their own parametrization with the job token
of alice's running attempt, as a runner holds it. Path parameters, snapshot bodies and a batch's
`attempt` are either what schemathesis generated or real (`real`), so `/jobs/{job_id}/...`
reaches real jobs and a batch reaches the ledger, not only 404s and 400s.

Requests go through Django's WSGI handler in the test's transaction. The checks are the
response checks (no 5xx; status code, content type and body as documented), not schemathesis's
request-acceptance checks: a valid request may rightly be refused here (a 404 for a job id that
does not exist, a 400 for a batch naming another attempt).

Not covered here: the console's websocket (not an HTTP operation, so not in the schema; see
tests/console/test_live.py), and the console session (`ConsoleSession`) as a second way in to the
same operations (CSRF and sessions are Django's; tests/reads/test_isolation.py covers the door).
Input the generators rarely reach (NUL in a path, numbers past bigint, very deep JSON, bodies
past Django's caps) is in test_api_refusals.py.
"""

import datetime as dt
import io
import tarfile

import hypothesis
import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import jobs.api.jobs
from jobs.actions.tokens import create_token
from jobs.job_tokens import job_token
from jobs.models import JobEvent
from jobs.states import JobStatus
from jobs.stores import logstore
from jobs.stores.metrics import ingest
from jobs.stores.snapshots import store_snapshot
from starforge.api import api
from tests.factories import place, queued_job, with_attempt

# Snapshots are uploaded as raw bytes; generated ones are mostly not archives, as a fuzzer's are.
schemathesis.serializer.alias("application/gzip", "application/octet-stream")
# The WSGI handler serves the async log download by consuming its iterator (ASGI streams it).
pytestmark = pytest.mark.filterwarnings(
    "ignore:StreamingHttpResponse must consume asynchronous iterators"
)
schema = schemathesis.openapi.from_dict(api.get_openapi_schema())
schema.app = WSGIHandler()
users_schema = schema.exclude(tag="runner ingest")
runner_schema = schema.include(tag="runner ingest")
teams_schema = schema.include(tag="teams")

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Bounded and repeatable: the same examples on every run, however slow the machine.
BOUNDED = hypothesis.settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
# Which real row a path parameter names; the last choice keeps what schemathesis generated.
REAL = st.integers(min_value=0, max_value=4)


class JumpingClock:
    """`time.monotonic` for the logs view: a follow on a running job waits up to 30 s for new
    lines by design; with this clock each wait is one poll, so the run stays bounded."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 60.0
        return self.now


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    """The test's transaction must survive each request, as under Django's test client."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def world(make_team, make_user, monkeypatch, settings):
    """Alice's team with jobs in several states; returns the real values path parameters take."""
    monkeypatch.setattr(jobs.api.jobs, "time", JumpingClock())
    # The generated bad tokens would otherwise lock this address out for the rest of the run
    # (429, documented on every operation); the throttle has its own tests.
    settings.SF_TOKEN_MAX_FAILURES = 1_000_000
    vision, nlp = make_team("vision"), make_team("nlp")
    alice = make_user("alice", vision)
    ada = make_user("ada", vision, role="admin")
    make_user("vic", vision, role="viewer")
    bob = make_user("bob", nlp)
    snapshot, _ = store_snapshot(io.BytesIO(tiny_archive()), "application/gzip", None, team=vision)
    running = queued_job(vision, alice, name="running", snapshot=snapshot)
    with_attempt(running, JobStatus.RUNNING, start_time=timezone.now() - dt.timedelta(hours=1))
    logstore.append(running.pk, 1, [{"seq": 0, "stream": "stdout", "ts": 1.0, "text": "step 1"}])
    point = {"seq": 0, "kind": "train", "name": "loss", "step": 1, "value": 0.5, "ts": 1.0}
    ingest.append(running.pk, 1, [point])
    JobEvent.objects.create(job=running, kind=JobEvent.Kind.NOTE, reason="a note", actor="test")
    failed = queued_job(vision, alice, name="failed")
    with_attempt(failed, JobStatus.FAILED, start_time=timezone.now(), end_time=timezone.now())
    queued = queued_job(vision, alice, name="queued")
    paused = place(queued_job(vision, alice, name="paused"), JobStatus.PAUSED)
    others = queued_job(nlp, bob, name="bobs")
    spare_token, _ = create_token(alice, "spare")
    return {
        "user_token": create_token(alice, "schemathesis")[1],
        "admin_token": create_token(ada, "schemathesis")[1],
        "job_token": job_token(running.pk, 1),
        "real": {
            "job_id": [running.pk, failed.pk, queued.pk, paused.pk, others.pk],
            "token_id": [spare_token.pk] * 5,
            "name": ["vision", "vision", "vision", "nlp", "nope"],
            "username": ["alice", "ada", "vic", "bob", "nobody"],
        },
    }


def tiny_archive() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"print('hello')\n"
        member = tarfile.TarInfo("train.py")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def use_real_rows(case, world: dict, real: int) -> None:
    """Unless `real` keeps what schemathesis generated, name real rows and send real bodies."""
    if real == 4:
        return
    for name in case.path_parameters or {}:
        if name in world["real"]:
            case.path_parameters[name] = world["real"][name][real]
    if case.media_type == "application/gzip":
        case.body = tiny_archive()
    elif isinstance(case.body, dict) and "attempt" in case.body:
        case.body["attempt"] = 1  # the attempt the job token names


@pytest.mark.django_db
@users_schema.parametrize()
@users_schema.given(real=REAL)
@BOUNDED
def test_user_operations_answer_as_documented(case, real, world):
    use_real_rows(case, world, real)
    case.call_and_validate(
        headers={"Authorization": f"Bearer {world['user_token']}"}, checks=CHECKS
    )


@pytest.mark.django_db
@teams_schema.parametrize()
@teams_schema.given(real=REAL)
@BOUNDED
def test_team_operations_answer_a_team_admin_as_documented(case, real, world):
    use_real_rows(case, world, real)
    case.call_and_validate(
        headers={"Authorization": f"Bearer {world['admin_token']}"}, checks=CHECKS
    )


@pytest.mark.django_db
@runner_schema.parametrize()
@runner_schema.given(real=REAL)
@BOUNDED
def test_runner_ingest_answers_as_documented(case, real, world):
    use_real_rows(case, world, real)
    case.call_and_validate(headers={"Authorization": f"Bearer {world['job_token']}"}, checks=CHECKS)
