"""`sf notify add|list|show|test|remove` against the real server (live_server): what the CLI
sends, what it prints, and that the API's refusals reach the user as one `error:` line."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from jobs.actions import webhooks
from jobs.ledger import outbox
from jobs.loops import deliveries
from jobs.models import Membership, Webhook, WebhookDelivery
from jobs.webhooks import send

pytestmark = pytest.mark.django_db(transaction=True)
HOOK = "http://127.0.0.1:9/hook"  # resolves; nothing listens, and `add` sends nothing
Sf = Callable[..., tuple[int, str, str]]


@pytest.fixture(autouse=True)
def queued(monkeypatch) -> list:
    """What the server hands Celery to send (no worker runs here): the test sends it itself."""
    handed: list = []
    monkeypatch.setattr(outbox, "enqueue", handed.append)
    return handed


@pytest.fixture
def loopback_allowed(settings) -> None:
    settings.SF_WEBHOOK_ALLOWED_NETS = ["127.0.0.0/8"]


@pytest.fixture
def receiver() -> Iterator[tuple[str, list]]:
    """An http://127.0.0.1 receiver that answers 200: (its hook URL, the (headers, body) got)."""
    got: list = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append((dict(self.headers), body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", got
    server.shutdown()
    server.server_close()


def add(sf: Sf, *argv: str) -> Webhook:
    code, out, err = sf("notify", "add", *argv)
    assert code == 0, err
    return Webhook.objects.order_by("-pk").first()


# -- add -------------------------------------------------------------------------------------
def test_add_sends_the_events_and_wait_and_prints_id_scope_events_and_secret(
    sf, alice, loopback_allowed
) -> None:
    code, out, err = sf(
        "notify", "add", HOOK, "--on", "waiting-too-long, failed,succeeded", "--wait", "30m"
    )
    assert code == 0, err
    hook = Webhook.objects.get()
    assert (hook.owner, hook.team, hook.url) == (alice, None, HOOK)
    assert (hook.events, hook.wait_after_s) == (["succeeded", "failed", "waiting-too-long"], 1800)
    assert out == (
        f"added webhook {hook.pk} (mine) on succeeded, failed, waiting-too-long (after 30m): "
        f"{HOOK}\nsecret: {hook.secret}\n"
    )
    assert "signs the Starforge-Signature header" in err


def test_add_without_wait_leaves_the_servers_default(sf, loopback_allowed) -> None:
    hook = add(sf, HOOK, "--on", "preempted")
    assert (hook.events, hook.wait_after_s) == (["preempted"], webhooks.WAIT_DEFAULT_S)


def test_add_for_a_team_as_its_admin_json_prints_the_answer(
    sf, alice, team, loopback_allowed
) -> None:
    Membership.objects.filter(user=alice, team=team).update(role=Membership.Role.ADMIN)
    code, out, err = sf("notify", "add", HOOK, "--on", "failed", "--team", "vision", "--json")
    assert code == 0, err
    answer = json.loads(out)
    hook = Webhook.objects.get()
    assert hook.team == team
    assert {k: answer[k] for k in ("id", "scope", "team", "on", "secret", "kind")} == {
        "id": hook.pk,
        "scope": "team",
        "team": "vision",
        "on": ["failed"],
        "secret": hook.secret,
        "kind": "json",
    }


# -- refusals: the API's sentence, exit 1, nothing written -------------------------------------
@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (
            [HOOK, "--on", "failed,nonsense"],
            "unknown event 'nonsense': say which of succeeded, failed, stopped, preempted, "
            "waiting-too-long, budget-alert, idle, suspected-hang to be told about",
        ),
        (
            ["ftp://x", "--on", "failed"],
            "'ftp://x' is not an http(s) URL or a mailto: address; "
            "give e.g. https://hooks.example.com/starforge",
        ),
        (
            [HOOK, "--on", "waiting-too-long", "--wait", "10s"],
            "wait_after_s must be 60 to 604800 seconds (1 min to 7 days), not 10",
        ),
        (
            [HOOK, "--on", "failed", "--team", "vision"],
            "only team vision's admins may add a webhook for all its jobs; "
            "leave the team out to be told about your own jobs",
        ),
    ],
    ids=["unknown-event", "not-http", "wait-too-short", "team-member-not-admin"],
)
def test_add_refused_prints_the_servers_sentence(sf, loopback_allowed, argv, sentence) -> None:
    code, out, err = sf("notify", "add", *argv)
    assert (code, out, err) == (1, "", f"error: {sentence}\n")
    assert not Webhook.objects.exists()


def test_add_refuses_loopback_unless_an_admin_allows_it(sf, settings) -> None:
    settings.SF_WEBHOOK_ALLOWED_NETS = []
    code, out, err = sf("notify", "add", "http://127.0.0.1:9/x", "--on", "failed")
    assert (code, out) == (1, "")
    assert err == (
        "error: host 127.0.0.1 resolves to 127.0.0.1, a loopback address, which webhooks may "
        "not reach unless an admin allows it\n"
    )
    assert not Webhook.objects.exists()


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        ([HOOK], "the following arguments are required: --on"),
        ([HOOK, "--on", "failed", "--wait", "soon"], "argument --wait: 'soon' is not"),
    ],
    ids=["no-on", "wait-not-a-duration"],
)
def test_add_usage_errors_exit_2_before_asking_the_server(sf, argv, complaint) -> None:
    code, _, err = sf("notify", "add", *argv)
    assert code == 2
    assert complaint in err
    assert not Webhook.objects.exists()


# -- list, show ------------------------------------------------------------------------------
def test_list_shows_id_scope_events_kind_and_url(sf, alice, team, loopback_allowed) -> None:
    mine = add(sf, HOOK, "--on", "failed,succeeded")
    Membership.objects.filter(user=alice, team=team).update(role=Membership.Role.ADMIN)
    theirs = add(sf, "http://127.0.0.1:9/team", "--on", "preempted", "--team", "vision")
    code, out, err = sf("notify", "list")
    assert code == 0, err
    header, *rows = [line.split() for line in out.splitlines()]
    assert header == ["ID", "SCOPE", "ON", "KIND", "URL"]
    assert rows == [
        [str(mine.pk), "mine", "succeeded,", "failed", "json", HOOK],
        [str(theirs.pk), "team", "vision", "preempted", "json", "http://127.0.0.1:9/team"],
    ]
    assert mine.secret not in out


def test_list_json_prints_the_answer(sf, loopback_allowed) -> None:
    hook = add(sf, HOOK, "--on", "stopped")
    code, out, _ = sf("notify", "list", "--json")
    assert code == 0
    [answer] = json.loads(out)
    assert (answer["id"], answer["scope"], answer["on"], answer["url"]) == (
        hook.pk,
        "mine",
        ["stopped"],
        HOOK,
    )


def test_show_prints_the_fields_and_secret_and_no_deliveries_yet(sf, loopback_allowed) -> None:
    hook = add(sf, HOOK, "--on", "failed,waiting-too-long", "--wait", "2h")
    code, out, err = sf("notify", "show", str(hook.pk))
    assert code == 0, err
    fields = dict(line.split(":", 1) for line in out.splitlines() if not line.startswith(" "))
    fields = {k: v.strip() for k, v in fields.items()}
    assert fields["id"] == str(hook.pk)
    assert fields["url"] == HOOK
    assert (fields["scope"], fields["owner"], fields["kind"]) == ("mine", "alice", "json")
    assert fields["on"] == "failed, waiting-too-long (after 2h)"
    assert fields["wait after"] == "2h"
    assert fields["secret"] == hook.secret
    assert out.endswith(f"deliveries:\n  none yet: `sf notify test {hook.pk}` sends one\n")


def test_show_someone_elses_webhook_is_not_found(sf, make_user, loopback_allowed) -> None:
    bob = make_user("bob")
    hook = webhooks.create(bob, HOOK, ["failed"])
    code, out, err = sf("notify", "show", str(hook.pk))
    assert (code, out) == (1, "")
    assert err == f"error: webhook {hook.pk} does not exist or is not yours\n"


# -- test ------------------------------------------------------------------------------------
def test_test_queues_a_delivery_that_show_reports_pending_then_delivered(
    sf, queued, receiver, loopback_allowed
) -> None:
    url, got = receiver
    hook = add(sf, url, "--on", "failed")
    code, out, err = sf("notify", "test", str(hook.pk))
    assert code == 0, err
    delivery = WebhookDelivery.objects.get(webhook=hook)
    assert out == (
        f"test delivery {delivery.pk} (Idempotency-Key {delivery.key}) queued\n"
        f"it is sent in the background: `sf notify show {hook.pk}` shows how it went\n"
    )
    assert queued == [[delivery.pk]]

    code, out, _ = sf("notify", "show", str(hook.pk))
    assert code == 0
    pending = out.split("deliveries:\n", 1)[1].splitlines()
    assert pending[0].startswith(f"  {delivery.pk} pending test no job, created ")
    assert ", next try " in pending[0]
    assert pending[1:] == ["    not tried yet"]

    assert deliveries.deliver_due(queued[0]) == 1  # what the Celery task does
    [(headers, body)] = got
    assert send.verify(hook.secret, headers[send.SIGNATURE_HEADER], body)
    code, out, _ = sf("notify", "show", str(hook.pk))
    delivered = out.split("deliveries:\n", 1)[1].splitlines()
    assert delivered[0].startswith(f"  {delivery.pk} delivered test no job, created ")
    assert "next try" not in delivered[0]
    [try_line] = delivered[1:]
    assert try_line.split()[2:] == ["200", "HTTP", "200", "OK"]

    code, out, _ = sf("notify", "show", str(hook.pk), "--json")
    [answer] = json.loads(out)["deliveries"]
    assert (answer["id"], answer["state"], answer["tries"][0]["status"]) == (
        delivery.pk,
        "delivered",
        200,
    )


def test_show_prints_a_failed_try_with_no_status_and_its_detail(sf, loopback_allowed) -> None:
    hook = add(sf, HOOK, "--on", "failed")  # port 9: nothing listens
    assert sf("notify", "test", str(hook.pk))[0] == 0
    deliveries.deliver_due()
    code, out, _ = sf("notify", "show", str(hook.pk))
    lines = out.split("deliveries:\n", 1)[1].splitlines()
    assert lines[0].split()[1:4] == ["pending", "test", "no"]
    assert ", next try " in lines[0]
    [try_line] = lines[1:]
    assert try_line.split()[2] == "none"
    assert "ConnectionRefusedError" in try_line


def test_test_json_prints_the_delivery(sf, loopback_allowed) -> None:
    hook = add(sf, HOOK, "--on", "failed")
    code, out, _ = sf("notify", "test", str(hook.pk), "--json")
    assert code == 0
    answer = json.loads(out)
    delivery = WebhookDelivery.objects.get(webhook=hook)
    assert (answer["id"], answer["key"], answer["state"]) == (delivery.pk, delivery.key, "pending")


def test_test_of_a_missing_webhook_prints_the_servers_sentence(sf) -> None:
    code, out, err = sf("notify", "test", "999")
    assert (code, out, err) == (1, "", "error: webhook 999 does not exist or is not yours\n")


# -- remove ----------------------------------------------------------------------------------
def test_remove_deletes_the_webhook_and_show_then_says_so(sf, loopback_allowed) -> None:
    hook = add(sf, HOOK, "--on", "failed")
    code, out, err = sf("notify", "remove", str(hook.pk))
    assert (code, out) == (0, f"webhook {hook.pk} removed\n"), err
    assert not Webhook.objects.exists()
    code, out, err = sf("notify", "remove", str(hook.pk))
    assert (code, err) == (1, f"error: webhook {hook.pk} does not exist or is not yours\n")


def test_remove_needs_a_numeric_id(sf) -> None:
    assert sf("notify", "remove", "abc")[0] == 2


def test_notify_alone_shows_help(sf) -> None:
    code, _, err = sf("notify")
    assert code == 2
    assert "add" in err and "remove" in err
