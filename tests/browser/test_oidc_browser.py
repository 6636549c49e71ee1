"""Issue 51, point 1: signing in through a real OpenID provider (npm's oidc-provider on
loopback) in the real browser. The first sign-in creates the user with the team role their
IdP group maps to; a group change at the provider changes the role at the next sign-in; the
person makes an API token for `sf login` on the tokens page; once the provider disables them
their open session ends at its next request and they cannot sign in again."""

import json
import os
import re

import pytest
from django.contrib.auth.models import User

from jobs.models import ApiToken, Membership
from jobs.oidc_config import oidc_from_environ
from tests.identity.openid_provider import OpenIdProvider

pytestmark = pytest.mark.django_db(transaction=True)

GROUP_MAP = {"ml": "vision:member", "ml-admins": ["vision:admin", "nlp:viewer"]}


@pytest.fixture
def provider(live_server, tmp_path):
    running = OpenIdProvider(tmp_path, redirect_uri=f"{live_server.url}/oidc/callback/")
    yield running
    running.close()


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright():
    """Playwright's sync API keeps an event loop running in this thread for the module; the
    ORM calls of the tests and of the database fixtures are plain synchronous ones."""
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
    yield
    if before is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture
def sso(settings, provider, make_team):
    settings.SF_OIDC = oidc_from_environ(
        provider.environ(SF_OIDC_GROUP_MAP=json.dumps(GROUP_MAP), SF_OIDC_RECHECK_S="0")
    )
    make_team("vision")
    make_team("nlp")
    return provider


def sign_in(browser, base_url: str, login: str):
    """A fresh browser context through the provider's pages; returns the page where it ends."""
    page = browser.new_context(base_url=base_url).new_page()
    page.goto("/accounts/login/")
    page.click("#sso-sign-in")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "anything")
    page.click("button[type=submit]")
    if page.locator("input[name=prompt][value=consent]").count():
        page.click("button[type=submit]")
    page.wait_for_load_state()
    return page


def roles(username: str) -> dict[str, str]:
    return dict(
        Membership.objects.filter(user__username=username).values_list("team__name", "role")
    )


def test_sign_in_maps_groups_to_roles_each_time_and_a_disabled_person_is_out(
    browser, live_server, sso
):
    sso.set_account("ada", groups=["ml"])
    page = sign_in(browser, live_server.url, "ada")
    assert page.url == f"{live_server.url}/", page.content()[:500]
    ada = User.objects.get(username="ada")
    assert ada.identity.oidc_subject == "ada" and not ada.has_usable_password()
    assert not ada.is_staff and roles("ada") == {"vision": "member"}

    sso.set_account("ada", groups=["ml-admins"])
    page = sign_in(browser, live_server.url, "ada")
    assert page.url == f"{live_server.url}/"
    assert roles("ada") == {"vision": "admin", "nlp": "viewer"}

    page.goto("/tokens/")  # `sf login`'s way in: a token made here after SSO
    page.fill("input[name=name]", "laptop")
    page.click("text=Create token")
    secret = page.inner_text("#new-token-secret").strip()
    assert secret and ApiToken.objects.filter(user=ada, name="laptop").exists()

    sso.set_account("ada", groups=["ml-admins"], disabled=True)
    page.goto("/")
    assert re.search(r"/accounts/login/\?sso=ended$", page.url), page.url
    assert "no longer vouches" in page.content()

    page = sign_in(browser, live_server.url, "ada")
    assert not page.url.startswith(f"{live_server.url}/") or "/accounts/login/" in page.url
    page.goto(f"{live_server.url}/")
    assert "/accounts/login/" in page.url


def test_a_group_lost_at_the_provider_is_a_membership_lost_at_the_next_sign_in(
    browser, live_server, sso
):
    sso.set_account("bo", groups=["ml"])
    sign_in(browser, live_server.url, "bo")
    assert roles("bo") == {"vision": "member"}
    sso.set_account("bo", groups=["unmapped"])
    page = sign_in(browser, live_server.url, "bo")
    assert page.url == f"{live_server.url}/"
    assert roles("bo") == {}
