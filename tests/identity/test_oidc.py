"""Issue 51, point 1, without a browser: the SF_OIDC_* configuration and its refusals, the
group map's strongest-role rule, who a first sign-in becomes (never an account the IdP does not
manage, never staff), password sign-in turned off, and OIDC off answering 404."""

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.identities import Identity
from jobs.models import Membership
from jobs.oidc import Backend, mapped_roles
from jobs.oidc_config import oidc_from_environ, password_login

pytestmark = pytest.mark.django_db

ENDPOINTS = {
    "SF_OIDC_AUTHORIZATION_ENDPOINT": "https://idp.example.org/auth",
    "SF_OIDC_TOKEN_ENDPOINT": "https://idp.example.org/token",
    "SF_OIDC_USERINFO_ENDPOINT": "https://idp.example.org/me",
    "SF_OIDC_JWKS_URI": "https://idp.example.org/jwks",
    "SF_OIDC_CLIENT_ID": "starforge",
}


@pytest.fixture
def sso(settings, make_team):
    make_team("vision")
    settings.SF_OIDC = oidc_from_environ(
        ENDPOINTS | {"SF_OIDC_GROUP_MAP": json.dumps({"ml": "vision:member"})}
    )


def test_nothing_set_means_off_and_password_sign_in_stays():
    assert oidc_from_environ({}) is None
    assert password_login({}, None) is True


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SF_OIDC_ISSUER": "https://idp"}, "SF_OIDC_CLIENT_ID"),
        ({"SF_OIDC_CLIENT_ID": "x"}, "SF_OIDC_ISSUER"),
        (ENDPOINTS | {"SF_OIDC_GROUP_MAP": "{not json"}, "not JSON"),
        (ENDPOINTS | {"SF_OIDC_GROUP_MAP": '{"g": "vision:owner"}'}, "team:role"),
        (ENDPOINTS | {"SF_OIDC_GROUP_MAP": '["vision:admin"]'}, "JSON object"),
        (ENDPOINTS | {"SF_OIDC_RECHECK_S": "soon"}, "whole number"),
    ],
)
def test_a_bad_configuration_stops_the_start_with_a_sentence(env, says):
    with pytest.raises(RuntimeError, match=says):
        oidc_from_environ(env)


def test_password_sign_in_off_needs_oidc():
    with pytest.raises(RuntimeError, match="nobody could sign in"):
        password_login({"SF_PASSWORD_LOGIN": "0"}, None)


def test_the_strongest_mapped_role_wins_and_unreached_teams_are_left():
    group_map = {"a": [("vision", "viewer")], "b": [("vision", "admin")], "c": [("nlp", "member")]}
    assert mapped_roles(["a", "b", 7, None], group_map) == {"vision": "admin", "nlp": None}
    assert mapped_roles("not-a-list", group_map) == {"vision": None, "nlp": None}


def test_a_first_sign_in_never_takes_over_an_account_the_idp_does_not_manage(sso, make_user):
    root = User.objects.create_superuser("root", password="pw")
    local = make_user("ada")
    claims = {"sub": "idp-1", "preferred_username": "root", "groups": ["ml"]}
    first = Backend().create_user(claims)
    second = Backend().create_user({"sub": "idp-2", "preferred_username": "ada"})

    assert first.pk != root.pk and first.username == "root-2" and not first.is_staff
    assert second.pk != local.pk and second.username == "ada-2"
    assert Membership.objects.get(user=first).role == "member"
    root.refresh_from_db()
    assert not Identity.objects.filter(user__in=[root, local]).exists()


def test_a_first_sign_in_links_the_scim_provisioned_account_of_that_name(sso, make_user):
    provisioned = make_user("grace")
    Identity.objects.create(user=provisioned)
    user = Backend().create_user({"sub": "idp-3", "preferred_username": "grace"})
    assert user.pk == provisioned.pk and user.identity.oidc_subject == "idp-3"
    assert list(Backend().filter_users_by_claims({"sub": "idp-3"})) == [provisioned]


def test_an_inactive_accounts_session_no_longer_signs_in(sso, make_user):
    ada = make_user("ada")
    ada.is_active = False
    ada.save()
    assert Backend().get_user(ada.pk) is None


def test_with_oidc_off_its_routes_are_404_and_the_page_offers_the_password_form():
    client = Client()
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404
    page = client.get("/accounts/login/").content.decode()
    assert 'id="sso-sign-in"' not in page and 'name="password"' in page


def test_with_password_sign_in_off_only_sso_is_offered_and_passwords_fail(sso, settings):
    settings.SF_PASSWORD_LOGIN = False
    settings.AUTHENTICATION_BACKENDS = ["jobs.oidc.Backend"]
    User.objects.create_user("bob", password="a-long-password-9")
    client = Client()
    page = client.get("/accounts/login/").content.decode()
    assert 'id="sso-sign-in"' in page and 'name="password"' not in page
    client.post("/accounts/login/", {"username": "bob", "password": "a-long-password-9"})
    assert "_auth_user_id" not in client.session
