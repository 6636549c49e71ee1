"""The audit log's API operations (tag "audit") driven by schemathesis with valid and invalid
input, as a team admin and as staff, over real rows of two teams: no answer is a 5xx, and every
answer is one the schema documents. (tests/hostile/test_schemathesis.py drives them as a member.)
"""

import hypothesis
import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jobs import audit
from jobs.actions.tokens import create_token
from jobs.audit import Target
from starforge.api import api

schema = schemathesis.openapi.from_dict(api.get_openapi_schema()).include(tag="audit")
schema.app = WSGIHandler()
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
BOUNDED = hypothesis.settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
WHO = st.sampled_from(["admin", "staff"])


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def world(make_team, make_user, settings):
    settings.SF_TOKEN_MAX_FAILURES = 1_000_000
    vision, nlp = make_team("vision"), make_team("nlp")
    ada = make_user("ada", vision, role="admin")
    root = User.objects.create_user("root", password="pw", is_staff=True)
    audit.record(ada, "job.stop", Target("job", "1", "job 1", vision.pk, "vision"), {"a": 1}, None)
    audit.record(ada, "team.defaults", vision, {"max_jobs": 1}, {"max_jobs": 2})
    audit.record(root, "job.stop", Target("job", "2", "job 2", nlp.pk, "nlp"))
    return {"admin": create_token(ada, "s")[1], "staff": create_token(root, "s")[1]}


@pytest.mark.django_db
@schema.parametrize()
@schema.given(who=WHO)
@BOUNDED
def test_audit_operations_answer_as_documented(case, who, world):
    case.call_and_validate(headers={"Authorization": f"Bearer {world[who]}"}, checks=CHECKS)
