"""API tokens: create, list and revoke through the API and the console; revoked and expired
tokens answer 401; only the sha256 is stored and the secret is shown once."""

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from jobs.actions.tokens import create_token
from jobs.auth import LAST_USED_RESOLUTION, hash_token
from jobs.models import ApiToken
from tests.api_helpers import assert_refused

pytestmark = pytest.mark.django_db


def bearer(secret: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}")


def signed_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def test_create_answers_201_with_the_secret_and_stores_only_its_hash(api):
    response = api.post("/tokens", {"name": "laptop", "expires_in_days": 30})
    assert response.status_code == 201, response.content
    body = response.json()
    secret = body["secret"]
    assert secret.startswith("sf_") and body["prefix"] == secret[:10]
    assert body["name"] == "laptop" and body["revoked_at"] is None
    row = ApiToken.objects.get(pk=body["id"])
    assert row.key_hash == hash_token(secret)
    assert secret not in {row.key_hash, row.prefix, row.name}
    expires = dt.datetime.fromisoformat(body["expires_at"])
    assert dt.timedelta(days=29) < expires - timezone.now() <= dt.timedelta(days=30)


def test_a_new_token_works_and_is_listed_without_its_secret(api):
    secret = api.post("/tokens", {"name": "ci"}).json()["secret"]
    assert bearer(secret).get("/api/v1/me").json()["username"] == "alice"
    listed = api.get("/tokens").json()
    assert {t["name"] for t in listed} == {"cli", "ci"}  # the fixture's token and the new one
    raw = api.get("/tokens").content.decode()
    assert secret not in raw and "key_hash" not in raw and "secret" not in raw
    assert set(listed[0]) == {
        "id",
        "name",
        "prefix",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    }


def test_a_token_without_expiry_never_expires(api):
    assert api.post("/tokens", {"name": "forever"}).json()["expires_at"] is None


def test_list_shows_only_my_tokens(api, api_as, make_user):
    bob = api_as(make_user("bob"))
    bob.post("/tokens", {"name": "bobs-laptop"})
    assert "bobs-laptop" not in {t["name"] for t in api.get("/tokens").json()}


def test_a_revoked_token_answers_401_saying_so(api):
    created = api.post("/tokens", {"name": "old"}).json()
    response = api.client.delete(f"/api/v1/tokens/{created['id']}")
    assert response.status_code == 204
    assert_refused(bearer(created["secret"]).get("/api/v1/me"), 401, "revoked", created["prefix"])
    listed = {t["id"]: t for t in api.get("/tokens").json()}
    assert listed[created["id"]]["revoked_at"] is not None


def test_revoking_twice_is_harmless_and_keeps_the_first_time(api):
    token_id = api.post("/tokens", {"name": "old"}).json()["id"]
    assert api.client.delete(f"/api/v1/tokens/{token_id}").status_code == 204
    first = ApiToken.objects.get(pk=token_id).revoked_at
    assert api.client.delete(f"/api/v1/tokens/{token_id}").status_code == 204
    assert ApiToken.objects.get(pk=token_id).revoked_at == first


def test_another_users_token_is_404_and_stays_valid(api, api_as, make_user):
    bob = api_as(make_user("bob"))
    theirs = bob.post("/tokens", {"name": "bobs"}).json()
    assert_refused(api.client.delete(f"/api/v1/tokens/{theirs['id']}"), 404, "no such token")
    assert_refused(api.client.delete("/api/v1/tokens/999999"), 404, "no such token")
    assert bearer(theirs["secret"]).get("/api/v1/me").status_code == 200


def test_an_expired_token_answers_401_saying_so(api, monkeypatch):
    created = api.post("/tokens", {"name": "short", "expires_in_days": 1}).json()
    client = bearer(created["secret"])
    assert client.get("/api/v1/me").status_code == 200
    later = timezone.now() + dt.timedelta(days=1, seconds=1)
    monkeypatch.setattr(timezone, "now", lambda: later)
    assert_refused(client.get("/api/v1/me"), 401, "expired", created["prefix"])


def test_an_unknown_token_keeps_the_generic_401():
    assert_refused(bearer("sf_not-a-real-token").get("/api/v1/me"), 401, "token")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"name": ""}, "needs a name"),
        ({"name": "   "}, "needs a name"),
        ({"name": "x" * 101}, "at most 100 characters"),
        ({"name": "a", "expires_in_days": 0}, "between 1 and 3650"),
        ({"name": "a", "expires_in_days": 3651}, "between 1 and 3650"),
    ],
)
def test_bad_input_is_refused_with_a_sentence_and_creates_nothing(api, body, fragment):
    before = ApiToken.objects.count()
    assert_refused(api.post("/tokens", body), 400, fragment)
    assert ApiToken.objects.count() == before


def test_a_non_integer_expiry_is_422_naming_the_field(api):
    assert_refused(api.post("/tokens", {"name": "a", "expires_in_days": "soon"}), 422, "expires")


def test_last_used_at_is_recorded_at_most_once_per_resolution(alice, monkeypatch):
    row, secret = create_token(alice, "laptop")
    assert row.last_used_at is None
    client = bearer(secret)
    client.get("/api/v1/me")
    first = ApiToken.objects.get(pk=row.pk).last_used_at
    assert first is not None
    client.get("/api/v1/me")
    assert ApiToken.objects.get(pk=row.pk).last_used_at == first
    later = timezone.now() + LAST_USED_RESOLUTION + dt.timedelta(seconds=1)
    monkeypatch.setattr(timezone, "now", lambda: later)
    client.get("/api/v1/me")
    assert ApiToken.objects.get(pk=row.pk).last_used_at == later


def test_the_console_session_can_create_tokens_through_the_api(alice):
    response = signed_in(alice).post(
        "/api/v1/tokens", {"name": "web"}, content_type="application/json"
    )
    assert response.status_code == 201


# --- console page ----------------------------------------------------------------------


def test_the_tokens_page_needs_a_signed_in_user_and_is_in_the_nav(alice):
    assert Client().get("/tokens/").url.startswith("/accounts/login/")
    assert 'href="/tokens/"' in signed_in(alice).get("/").content.decode()


def test_creating_on_the_page_shows_the_secret_once(alice):
    client = signed_in(alice)
    page = client.post("/tokens/", {"name": "desk", "expires_in_days": "7"}).content.decode()
    row = ApiToken.objects.get(user=alice, name="desk")
    secret = page.split('id="new-token-secret">')[1].split("<")[0]
    assert row.key_hash == hash_token(secret)
    assert "will not be shown again" in page
    assert row.expires_at is not None
    listing = client.get("/tokens/").content.decode()
    assert "desk" in listing and row.prefix in listing and secret not in listing


def test_bad_input_on_the_page_shows_the_sentence(alice):
    page = signed_in(alice).post("/tokens/", {"name": "a", "expires_in_days": "0"})
    assert "between 1 and 3650" in page.content.decode()
    assert not ApiToken.objects.filter(user=alice).exists()


def test_revoking_on_the_page_refuses_the_token(alice):
    row, secret = create_token(alice, "desk")
    response = signed_in(alice).post(f"/tokens/{row.pk}/revoke/", follow=True)
    assert "revoked" in response.content.decode()
    assert_refused(bearer(secret).get("/api/v1/me"), 401, "revoked")


def test_revoking_another_users_token_on_the_page_is_404(alice, make_user):
    row, secret = create_token(make_user("bob"), "bobs")
    assert signed_in(alice).post(f"/tokens/{row.pk}/revoke/").status_code == 404
    assert bearer(secret).get("/api/v1/me").status_code == 200


def test_the_page_forms_need_the_csrf_token(alice):
    row, secret = create_token(alice, "desk")
    client = signed_in(alice, enforce_csrf_checks=True)
    assert client.post("/tokens/", {"name": "sneaky"}).status_code == 403
    assert client.post(f"/tokens/{row.pk}/revoke/").status_code == 403
    assert not ApiToken.objects.filter(name="sneaky").exists()
    assert bearer(secret).get("/api/v1/me").status_code == 200


def test_the_api_refuses_a_session_delete_without_csrf(alice):
    row, secret = create_token(alice, "desk")
    client = signed_in(alice, enforce_csrf_checks=True)
    assert client.delete(f"/api/v1/tokens/{row.pk}").status_code == 403
    assert ApiToken.objects.get(pk=row.pk).revoked_at is None


def test_a_non_numeric_expiry_on_the_page_shows_a_sentence(alice):
    page = signed_in(alice).post("/tokens/", {"name": "a", "expires_in_days": "soon"})
    assert "whole number of days" in page.content.decode()
    assert not ApiToken.objects.filter(user=alice).exists()
