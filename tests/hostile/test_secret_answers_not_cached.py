"""Every answer that shows a secret says `Cache-Control: no-store` (issue 47, point 7).

A browser keeps a page in its disk cache and shows it again from the Back button, and a proxy or
CDN in front of the server may keep an answer it was not told to drop: a token or signing secret
shown once must not be kept by either. The walk covers what shows a secret now: a new API token
(API and console), a webhook's signing secret (API and the Notifications page, a refused add
included), and a runner's job token (the bootstrap exchange). Two sweeps keep it whole: every
API operation whose answer has a `secret` or `token` field, and every console page that
contains a live secret when signed in, must be in it.

The demo user's password is shown by no answer (`make run` prints it and keeps it in
SF_VAR_DIR/demo-password); Django's admin and sign-in pages send `never_cache` already.
"""

import json

import pytest
from django.test import Client
from django.urls import reverse

from jobs.actions.tokens import create_token
from jobs.job_tokens import bootstrap_token_for
from jobs.models import Membership, Webhook
from starforge.api import api as ninja_api
from tests.api_helpers import submit
from tests.hostile.console_routes import ROUTE_ARGS, fill
from tests.ingesting import attach_attempt

pytestmark = pytest.mark.django_db
SECRET_FIELDS = {"secret", "token"}
HOOK_SECRET = "c0ffee" * 10


@pytest.fixture
def world(team, alice, api, settings):
    """alice, a team admin, with a token, a webhook and a running attempt's bootstrap
    credential; a browser signed in as her. Email targets are on, so adding one needs no DNS."""
    settings.SF_NOTIFY_EMAIL = True
    Membership.objects.filter(user=alice).update(role="admin")
    _, secret = create_token(alice, "laptop")
    hook = Webhook.objects.create(
        owner=alice, url="https://hooks.example.com/x", events=["failed"], secret=HOOK_SECRET
    )
    attempt = attach_attempt(submit(api), 1)
    browser = Client()
    browser.force_login(alice)
    return {
        "user": Client(HTTP_AUTHORIZATION=f"Bearer {secret}"),
        "runner": Client(HTTP_AUTHORIZATION=f"Bearer {bootstrap_token_for(attempt)}"),
        "browser": browser,
        "hook": hook.pk,
        "job": attempt.job_id,
    }


def post_json(client: Client, url: str, body: dict):
    return client.post(url, json.dumps(body), content_type="application/json")


# (who, method, path as in the OpenAPI schema, how to send it): every answer showing a secret.
API_ANSWERS = {
    ("user", "post", "/api/v1/tokens"): lambda c, w: post_json(c, "/api/v1/tokens", {"name": "x"}),
    ("user", "post", "/api/v1/webhooks"): lambda c, w: post_json(
        c, "/api/v1/webhooks", {"url": "mailto:ops@example.com", "on": ["failed"]}
    ),
    ("user", "get", "/api/v1/webhooks/{webhook_id}"): lambda c, w: c.get(
        f"/api/v1/webhooks/{w['hook']}"
    ),
    ("runner", "post", "/api/v1/ingest/token"): lambda c, w: post_json(
        c, "/api/v1/ingest/token", {"attempt": 1}
    ),
}
CONSOLE_ANSWERS = {
    "tokens page": lambda c, w: c.get(reverse("tokens")),
    "tokens page with a new token": lambda c, w: c.post(reverse("tokens"), {"name": "laptop-2"}),
    "notifications page": lambda c, w: c.get(reverse("notifications")),
    "notifications page refusing an add": lambda c, w: c.post(
        reverse("notification-add"), {"url": "ftp://x", "on": ["failed"]}
    ),
}


def assert_not_kept(response) -> None:
    assert "no-store" in response.get("Cache-Control", ""), dict(response.headers)


@pytest.mark.parametrize("who, method, path", sorted(API_ANSWERS))
def test_an_api_answer_with_a_secret_is_no_store(world, who, method, path):
    response = API_ANSWERS[(who, method, path)](world[who], world)
    assert response.status_code in (200, 201), response.content[:300]
    assert SECRET_FIELDS & response.json().keys()
    assert_not_kept(response)


@pytest.mark.parametrize("page", sorted(CONSOLE_ANSWERS))
def test_a_console_page_with_a_secret_is_no_store(world, page):
    response = CONSOLE_ANSWERS[page](world["browser"], world)
    assert response.status_code < 500, response.content[:300]
    assert_not_kept(response)


def test_the_new_tokens_secret_is_on_the_page_that_is_not_kept(world):
    response = CONSOLE_ANSWERS["tokens page with a new token"](world["browser"], world)
    assert b'id="new-token-secret"' in response.content
    assert_not_kept(response)


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _shows_a_secret(schema: dict, operation: dict) -> bool:
    for status, answer in operation.get("responses", {}).items():
        if not str(status).startswith("2"):
            continue
        for content in answer.get("content", {}).values():
            body = _resolve(schema, content.get("schema", {}))
            if SECRET_FIELDS & set(body.get("properties", {})):
                return True
    return False


def test_every_api_operation_answering_a_secret_is_in_the_walk():
    schema = ninja_api.get_openapi_schema()
    showing = {
        (method, path)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if _shows_a_secret(schema, operation)
    }
    walked = {(method, path) for _, method, path in API_ANSWERS}
    assert showing == walked, "an answer with a secret: add it to API_ANSWERS and never_cache it"


def test_every_console_page_showing_a_live_secret_is_not_kept(world):
    """Each console page a signed-in user may GET: where its body holds the webhook's signing
    secret, it must not be kept."""
    ids = {"JOB": world["job"], "HOOK": world["hook"], "TOKEN": 0, "ARRAY": 0}
    showed = []
    for name, kwargs in ROUTE_ARGS.items():
        if name == "logout":
            continue  # the walk stays signed in
        response = world["browser"].get(reverse(name, kwargs=fill(kwargs, ids)))
        if HOOK_SECRET.encode() in response.content:
            showed.append(name)
            assert "no-store" in response.get("Cache-Control", ""), name
    assert showed == ["notifications"]
