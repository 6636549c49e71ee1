"""Token lineage: a token made with a token cannot outlive it, and goes when it is revoked.

A leaked short-lived token must not be turned into a permanent one, and revoking a leaked
token must take with it every token minted from it. Job tokens mint nothing.
"""

import datetime as dt
import io

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from jobs.actions.tokens import create_token, revoke_token
from jobs.auth import TokenRefused
from jobs.job_tokens import job_token
from jobs.models import ApiToken
from tests.api_helpers import assert_refused, submit
from tests.ingesting import attach_attempt

pytestmark = pytest.mark.django_db


def bearer(secret: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}")


def mint(secret: str, **body):
    return bearer(secret).post(
        "/api/v1/tokens", {"name": "child", **body}, content_type="application/json"
    )


@pytest.fixture
def week_token(alice) -> tuple[ApiToken, str]:
    """A token of alice's that expires in 7 days, made on the console (no creator)."""
    return create_token(alice, "week", expires_in_days=7)


def test_a_token_made_with_an_expiring_token_inherits_its_expiry(week_token):
    parent, secret = week_token
    response = mint(secret)
    assert response.status_code == 201, response.content
    child = ApiToken.objects.get(pk=response.json()["id"])
    assert child.expires_at == parent.expires_at
    assert child.created_by_id == parent.pk


def test_asking_to_outlive_the_creating_token_is_400_with_a_sentence(week_token):
    _, secret = week_token
    before = ApiToken.objects.count()
    for days in (8, 3650):
        assert_refused(
            mint(secret, expires_in_days=days),
            400,
            "cannot outlive the token that creates it",
            "at most 6 days",
        )
    assert ApiToken.objects.count() == before


def test_a_shorter_expiry_than_the_creators_is_granted(week_token):
    parent, secret = week_token
    body = mint(secret, expires_in_days=3).json()
    expires = dt.datetime.fromisoformat(body["expires_at"])
    assert expires < parent.expires_at
    assert dt.timedelta(days=2) < expires - timezone.now() <= dt.timedelta(days=3)


def test_a_grandchild_cannot_outlive_the_first_token_either(week_token):
    parent, secret = week_token
    child_secret = mint(secret).json()["secret"]
    assert_refused(mint(child_secret, expires_in_days=30), 400, "cannot outlive")
    grandchild = ApiToken.objects.get(pk=mint(child_secret).json()["id"])
    assert grandchild.expires_at == parent.expires_at


def test_a_creator_within_its_last_day_allows_only_its_own_expiry(alice, monkeypatch):
    parent, secret = create_token(alice, "day", expires_in_days=1)
    later = timezone.now() + dt.timedelta(hours=12)
    monkeypatch.setattr(timezone, "now", lambda: later)
    assert_refused(mint(secret, expires_in_days=1), 400, "omit expires_in_days")
    assert mint(secret).json()["expires_at"] is not None


def test_revoking_a_token_revokes_every_token_it_created_recursively(alice, week_token):
    parent, secret = week_token
    child = mint(secret).json()
    grandchild = mint(child["secret"]).json()
    sibling, sibling_secret = create_token(alice, "unrelated")
    revoke_token(alice, parent.pk)
    for made in (child, grandchild):
        assert_refused(bearer(made["secret"]).get("/api/v1/me"), 401, "revoked")
    assert bearer(sibling_secret).get("/api/v1/me").status_code == 200


def test_revoking_through_the_api_revokes_the_children_too(api, alice):
    parent = api.post("/tokens", {"name": "parent", "expires_in_days": 30}).json()
    child = mint(parent["secret"]).json()
    assert api.client.delete(f"/api/v1/tokens/{parent['id']}").status_code == 204
    assert_refused(bearer(child["secret"]).get("/api/v1/me"), 401, "revoked")


def test_revoking_a_child_leaves_its_creator_alone(week_token):
    parent, secret = week_token
    child = mint(secret).json()
    assert bearer(secret).delete(f"/api/v1/tokens/{child['id']}").status_code == 204
    assert bearer(secret).get("/api/v1/me").status_code == 200
    assert ApiToken.objects.get(pk=parent.pk).revoked_at is None


def test_a_revoked_creator_mints_nothing_even_past_the_authenticator(alice, week_token):
    parent, _ = week_token
    revoke_token(alice, parent.pk)
    with pytest.raises(TokenRefused):
        create_token(alice, "late", creator=parent)


def test_tokens_from_the_console_and_the_shell_have_no_creator(alice):
    client = Client()
    client.force_login(alice)
    created = client.post("/api/v1/tokens", {"name": "web"}, content_type="application/json")
    assert ApiToken.objects.get(pk=created.json()["id"]).created_by is None
    call_command("issue_token", "alice", stdout=io.StringIO())
    assert ApiToken.objects.filter(user=alice, created_by__isnull=False).count() == 0


def test_a_job_token_cannot_create_or_list_tokens(api):
    job_id = submit(api)
    attach_attempt(job_id, 1)
    secret = job_token(job_id, 1)
    before = ApiToken.objects.count()
    assert_refused(mint(secret), 401)
    assert_refused(bearer(secret).get("/api/v1/tokens"), 401)
    assert ApiToken.objects.count() == before


def test_revoking_in_the_django_admin_revokes_the_children_too(alice, week_token):
    from django.contrib.auth.models import User

    parent, secret = week_token
    child = mint(secret).json()
    staff = User.objects.create_superuser("root-admin", password="pw")
    admin = Client()
    admin.force_login(staff)
    url = f"/admin/jobs/apitoken/{parent.pk}/change/"
    form = admin.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k in form.fields}
    now = timezone.now()
    data.update(
        {
            "user": alice.pk,
            "revoked_at_0": now.strftime("%Y-%m-%d"),
            "revoked_at_1": now.strftime("%H:%M:%S"),
            "expires_at_0": parent.expires_at.strftime("%Y-%m-%d"),
            "expires_at_1": parent.expires_at.strftime("%H:%M:%S"),
        }
    )
    data.pop("expires_at", None)
    data.pop("revoked_at", None)
    response = admin.post(url, data)
    assert response.status_code == 302, response.content[:2000]
    assert_refused(bearer(child["secret"]).get("/api/v1/me"), 401, "revoked")
