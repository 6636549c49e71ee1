"""The console under hostile use: CSRF on every state change, throttled guessing, safe headers.

CSRF is checked over the whole URL map: every console route and every API operation a session
may call refuses an unsafe method without the token (403) and lets it through with it. Failed
sign-ins and unknown bearer tokens are throttled (jobs.throttle) with 429 and a sentence.
"""

import re
import time

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from jobs.actions.tokens import create_token, revoke_token
from jobs.job_tokens import job_token
from starforge.api import api as ninja_api
from tests.api_helpers import assert_refused, submit
from tests.hostile.console_routes import ROUTE_ARGS, fill
from tests.ingesting import attach_attempt

pytestmark = pytest.mark.django_db
SAFE = {"get", "head", "options", "trace"}


def console_routes(patterns=None, prefix: str = "") -> list[tuple[str, str]]:
    """(name, route) of every console URL: the API and the Django admin are checked apart, and
    MLflow's and SCIM's endpoints take a bearer token only, never a session (so no CSRF):
    tests/hostile/test_mlflow_tokens.py and test_scim_access.py hold them to it."""
    found = []
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if route.startswith(("api/", "admin/", "^static", "^mlflow/", "scim/v2/")):
            continue
        if isinstance(entry, URLResolver):
            found += console_routes(entry.url_patterns, route)
        elif isinstance(entry, URLPattern):
            found.append((entry.name or route, route))
    return found


@pytest.fixture
def signed_in(team, alice, make_user, api):
    """A browser signed in as alice (a team admin), CSRF enforced, with her job and token."""
    from jobs.models import Membership, Webhook

    Membership.objects.filter(user=alice).update(role="admin")
    make_user("bob", team)
    job_id = submit(api)
    token, _ = create_token(alice, "laptop")
    array = api.post("/arrays", {"entrypoint": ["python", "train.py"], "array": "0-1"}).json()
    hook = Webhook.objects.create(
        owner=alice, url="https://hooks.example.com/x", events=["failed"], secret="s" * 64
    )
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    assert browser.get(reverse("tokens")).status_code == 200  # sets the CSRF cookie
    return browser, {"JOB": job_id, "TOKEN": token.pk, "ARRAY": array["id"], "HOOK": hook.pk}


def csrf(browser: Client) -> str:
    return browser.cookies["csrftoken"].value


def test_every_console_route_has_an_entry_in_the_csrf_walk():
    names = {name for name, _ in console_routes()}
    assert names == set(ROUTE_ARGS), "add the new route to ROUTE_ARGS"


@pytest.mark.parametrize("name", sorted(ROUTE_ARGS))
def test_a_console_post_without_the_csrf_token_is_403_and_with_it_is_not(signed_in, name):
    browser, ids = signed_in
    url = reverse(name, kwargs=fill(ROUTE_ARGS[name], ids))
    refused = browser.post(url, {"name": "x", "username": "bob", "role": "viewer"})
    assert refused.status_code == 403, (url, refused.status_code)
    assert b"CSRF" in refused.content
    passed = browser.post(
        url, {"name": "x", "csrfmiddlewaretoken": csrf(browser)}, HTTP_X_CSRFTOKEN=csrf(browser)
    )
    assert passed.status_code != 403, (url, passed.content[:300])


@pytest.mark.parametrize("name", ["admin:login", "admin:logout", "admin:jobs_job_changelist"])
def test_the_admins_forms_need_the_csrf_token_too(signed_in, name):
    browser, _ = signed_in
    assert browser.post(reverse(name)).status_code == 403


def session_operations() -> list[tuple[str, str]]:
    """(method, path) of every API operation that a console session may call unsafely."""
    schema = ninja_api.get_openapi_schema()
    found = []
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            schemes = {name for s in operation.get("security", []) for name in s}
            if method not in SAFE and "ConsoleSession" in schemes:
                found.append((method, path))
    return sorted(found)


def test_the_walk_over_session_operations_finds_the_job_controls():
    assert ("post", "/api/v1/jobs/{job_id}/stop") in session_operations()
    assert ("post", "/api/v1/snapshots") in session_operations()


@pytest.mark.parametrize("method,path", session_operations())
def test_an_unsafe_api_call_on_the_session_needs_the_csrf_token(signed_in, method, path):
    browser, ids = signed_in
    values = {"job_id": ids["JOB"], "token_id": ids["TOKEN"], "name": "vision", "username": "bob"}
    url = re.sub(r"\{(\w+)\}", lambda m: str(values.get(m.group(1), "x")), path)
    call = getattr(browser, method)
    refused = call(url, "{}", content_type="application/json")
    assert_refused(refused, 403, "CSRF")
    passed = call(url, "{}", content_type="application/json", HTTP_X_CSRFTOKEN=csrf(browser))
    assert passed.status_code != 403 or "CSRF" not in passed.json()["detail"], passed.content


# -- throttled sign-ins ----------------------------------------------------------------------------


def sign_in(client: Client, password: str, username: str = "alice", address: str = "10.0.0.1"):
    return client.post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address
    )


@pytest.fixture
def few_failures(settings):
    settings.SF_LOGIN_MAX_FAILURES = 3
    settings.SF_LOGIN_WINDOW_S = 600


def test_sign_ins_after_too_many_failures_are_429_even_with_the_right_password(alice, few_failures):
    client = Client()
    for _ in range(3):
        assert sign_in(client, "wrong").status_code == 200  # the form again, with its error
    refused = sign_in(client, "pw")
    assert refused.status_code == 429
    assert refused.content.decode() == "Too many failed sign-ins; try again in 10 minutes.\n"
    assert 590 <= int(refused["Retry-After"]) <= 600
    assert "_auth_user_id" not in client.session


def test_the_admins_sign_in_is_throttled_by_the_same_count(alice, few_failures):
    alice.is_staff = True
    alice.save()
    client = Client()
    for _ in range(2):
        sign_in(client, "wrong")
    admin = {"username": "alice", "password": "wrong", "next": "/admin/"}
    assert client.post("/admin/login/", admin, REMOTE_ADDR="10.0.0.1").status_code == 200
    refused = client.post("/admin/login/", {**admin, "password": "pw"}, REMOTE_ADDR="10.0.0.1")
    assert refused.status_code == 429
    assert "try again in 10 minutes" in refused.content.decode()


def test_the_count_is_per_username_and_address(alice, make_user, few_failures):
    make_user("carol")
    client = Client()
    for _ in range(3):
        sign_in(client, "wrong")
    assert sign_in(client, "wrong", username="ALICE ").status_code == 429  # same name, normalised
    assert sign_in(Client(), "pw", username="carol").status_code == 302
    assert sign_in(Client(), "pw", address="10.0.0.2").status_code == 302


def test_a_successful_sign_in_clears_the_count(alice, few_failures):
    for _ in range(2):
        sign_in(Client(), "wrong")
    assert sign_in(Client(), "pw").status_code == 302
    for _ in range(2):
        sign_in(Client(), "wrong")
    assert sign_in(Client(), "pw").status_code == 302


def test_sign_ins_are_allowed_again_when_the_window_ends(alice, settings):
    settings.SF_LOGIN_MAX_FAILURES, settings.SF_LOGIN_WINDOW_S = 2, 1
    for _ in range(2):
        sign_in(Client(), "wrong")
    assert sign_in(Client(), "pw").status_code == 429
    time.sleep(1.2)
    assert sign_in(Client(), "pw").status_code == 302


def test_the_default_limit_is_ten_failures(alice):
    client = Client()
    for _ in range(10):
        assert sign_in(client, "wrong").status_code == 200
    assert sign_in(client, "wrong").status_code == 429


def test_an_unreachable_throttle_cache_lets_sign_ins_through(alice, few_failures, settings):
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        },
    }
    for _ in range(4):
        assert sign_in(Client(), "wrong").status_code == 200
    assert sign_in(Client(), "pw").status_code == 302


# -- throttled bearer tokens -----------------------------------------------------------------------


def bearer(secret: str, address: str = "10.0.0.1") -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}", REMOTE_ADDR=address)


@pytest.fixture
def few_bad_tokens(settings):
    settings.SF_TOKEN_MAX_FAILURES = 3
    settings.SF_TOKEN_WINDOW_S = 60


def test_an_address_sending_unknown_tokens_gets_429_for_them_but_not_for_a_valid_token(
    api, alice, few_bad_tokens
):
    secret = create_token(alice, "good")[1]
    for n in range(3):
        assert_refused(bearer(f"sf_guess{n}").get("/api/v1/me"), 401)
    body = assert_refused(bearer("sf_guess3").get("/api/v1/me"), 429, "too many unknown tokens")
    assert 55 <= body["retry_after"] <= 60
    assert bearer(secret).get("/api/v1/me").status_code == 200
    assert bearer(secret, address="10.0.0.2").get("/api/v1/me").status_code == 200


def test_forged_job_tokens_count_towards_the_same_limit(api, few_bad_tokens):
    job_id = submit(api)
    attach_attempt(job_id, 1)
    real = job_token(job_id, 1)
    body = {"attempt": 1}
    forged = bearer(real[:-1] + ("A" if real[-1] != "A" else "B"))
    for _ in range(3):
        assert_refused(forged.post("/api/v1/ingest/started", body, "application/json"), 401)
    answer = forged.post("/api/v1/ingest/started", body, "application/json")
    assert_refused(answer, 429, "try again in")
    assert_refused(bearer("sf_guess").get("/api/v1/me"), 429, "too many unknown tokens")
    served = bearer(real).post("/api/v1/ingest/started", body, "application/json")
    assert served.status_code == 200, served.content  # a valid job token is never throttled


def test_successful_and_revoked_tokens_do_not_count(api, alice, few_bad_tokens):
    good = create_token(alice, "good")[1]
    old, old_secret = create_token(alice, "old")
    revoke_token(alice, old.pk)
    for _ in range(5):
        assert bearer(good).get("/api/v1/me").status_code == 200
        assert_refused(bearer(old_secret).get("/api/v1/me"), 401, "revoked")
    assert bearer(good).get("/api/v1/me").status_code == 200


def test_requests_without_a_token_do_not_count(api, alice, few_bad_tokens):
    for _ in range(5):
        assert Client(REMOTE_ADDR="10.0.0.1").get("/api/v1/me").status_code == 401
    assert bearer(create_token(alice, "good")[1]).get("/api/v1/me").status_code == 200


# -- security headers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,authorized",
    [
        ("/", "session"),
        ("/tokens/", "session"),
        ("/accounts/login/", None),
        ("/api/v1/me", "token"),
        ("/api/v1/jobs/999999", "token"),
        ("/api/v1/me", None),
    ],
)
def test_console_pages_and_api_answers_carry_the_security_headers(alice, path, authorized):
    client = Client()
    if authorized == "session":
        client.force_login(alice)
    elif authorized == "token":
        client = bearer(create_token(alice, "h")[1])
    response = client.get(path)
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
