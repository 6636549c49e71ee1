"""Issue 51, point 2, hostile: SCIM answers only the provisioning token, never a user's API
token nor a staff session, and it cannot make, see or change staff or superusers."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.actions.tokens import issue_token
from tests.identity.scim_calls import SCIM_TOKEN, ScimClient, patch, user_body

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _scim_on(settings):
    settings.SF_SCIM_TOKEN = SCIM_TOKEN


@pytest.fixture
def root(db) -> User:
    return User.objects.create_superuser("root", password="pw")


@pytest.mark.parametrize("path", ["Users", "Groups", "Schemas", "ServiceProviderConfig"])
def test_no_token_a_wrong_one_or_a_users_token_is_a_401(path, root):
    for bearer in (None, "wrong", SCIM_TOKEN[:-1], issue_token(root)):
        answer = ScimClient(bearer).get(path)
        assert answer.status_code == 401, bearer
        assert "provisioning token" in answer.json()["detail"]


def test_a_staff_console_session_is_not_the_token(root):
    client = Client()
    client.force_login(root)
    assert client.get("/scim/v2/Users").status_code == 401


def test_no_token_set_means_scim_is_off(settings):
    settings.SF_SCIM_TOKEN = ""
    answer = ScimClient("").get("Users")
    assert answer.status_code == 401 and "off" in answer.json()["detail"]


def test_scim_cannot_create_staff_or_superusers():
    scim = ScimClient()
    body = user_body(
        "mallory",
        is_staff=True,
        is_superuser=True,
        roles=[{"value": "admin"}, {"value": "staff"}],
        **{"urn:ietf:params:scim:schemas:extension:enterprise:2.0:User": {"isStaff": True}},
    )
    made = scim.send("POST", "Users", body)
    assert made.status_code == 201
    mallory = User.objects.get(username="mallory")
    assert not mallory.is_staff and not mallory.is_superuser
    for op in (
        {"op": "replace", "path": "is_staff", "value": True},
        {"op": "add", "value": {"roles": [{"value": "staff"}]}},
    ):
        assert scim.send("PATCH", f"Users/{made.json()['id']}", patch(op)).status_code == 400
    mallory.refresh_from_db()
    assert not mallory.is_staff and not mallory.is_superuser


def test_staff_are_invisible_to_scim_and_their_names_taken(root):
    scim = ScimClient()
    assert scim.get("Users").json()["Resources"] == []
    assert scim.send("POST", "Users", user_body("root")).status_code == 409
    root.refresh_from_db()
    assert root.is_superuser and root.is_active and root.has_usable_password()
