"""Issue 51, point 2, hostile: whatever JSON a SCIM client sends to /scim/v2/ (any shape, any
attribute, NULs, huge numbers, filters and ids of any text), the answer is a 2xx or a 4xx with
a SCIM error, never a 5xx. Schemathesis walks the ninja API's own schema; SCIM is outside it,
so hypothesis drives these routes directly."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.identities import Identity
from tests.identity.scim_calls import SCIM_TOKEN, ScimClient

pytestmark = pytest.mark.django_db

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=5)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "userName",
        "name",
        "emails",
        "active",
        "externalId",
        "displayName",
        "members",
        "schemas",
        "Operations",
        "op",
        "path",
        "value",
        "password",
        "groups",
    ]
)
BODIES = st.dictionaries(KEYS, JSON, max_size=6) | JSON
OPERATIONS = st.lists(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["add", "replace", "remove", "Add", "copy"]) | st.text(max_size=5)},
        optional={
            "path": st.sampled_from(
                [
                    "active",
                    "name.givenName",
                    "members",
                    'members[value eq "x"]',
                    "emails",
                    "userName",
                    "urn:ietf:params:scim:schemas:core:2.0:User:active",
                ]
            )
            | st.text(max_size=30),
            "value": JSON,
        },
    ),
    max_size=4,
)


@pytest.fixture
def targets(settings, team):
    settings.SF_SCIM_TOKEN = SCIM_TOKEN
    scim = ScimClient()
    made = scim.send("POST", "Users", {"userName": "fuzz", "emails": [{"value": "f@x.org"}]})
    return scim, [f"Users/{made.json()['id']}", f"Groups/{team.pk}"]


def _never_5xx(answer) -> None:
    assert answer.status_code < 500, answer.content[:300]
    if answer.status_code >= 400 and answer.content:
        assert json.loads(answer.content)["detail"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=BODIES, method=st.sampled_from(["POST", "PUT"]), kind=st.sampled_from([0, 1]))
def test_any_body_is_answered_without_a_5xx(targets, body, method, kind):
    scim, paths = targets
    path = paths[kind] if method == "PUT" else paths[kind].split("/")[0]
    _never_5xx(scim.send(method, path, body))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(operations=OPERATIONS, kind=st.sampled_from([0, 1]))
def test_any_patch_is_answered_without_a_5xx(targets, operations, kind):
    scim, paths = targets
    body = {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"], "Operations": operations}
    _never_5xx(scim.send("PATCH", paths[kind], body))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(max_size=60), kind=st.sampled_from(["Users", "Groups"]))
def test_any_filter_id_or_paging_is_answered_without_a_5xx(targets, text, kind):
    scim, _ = targets
    _never_5xx(scim.get(kind, filter=text))
    _never_5xx(scim.get(kind, startIndex=text, count=text, attributes=text))
    _never_5xx(scim.client.get(f"/scim/v2/{kind}/{text.replace('/', '')}"))
    assert Identity.objects.filter(user__is_staff=True).count() == 0
