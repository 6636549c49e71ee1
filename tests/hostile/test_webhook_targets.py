"""Issue 47, points 6 and 9 (webhooks): a webhook target must be globally routable — the shared
address space 100.64.0.0/10 (cloud metadata at 100.100.100.200, Tailscale, pod networks) and
the other special-purpose ranges included, an IPv6 address judged by the IPv4 one it carries —
when it is added and again at every delivery; a malformed URL is a 400 with a sentence from the
API and from the console's form, never a 500.

No test here sends a packet: the targets are address literals (no DNS asked), and the rebinding
test answers name lookups itself and refuses any connection."""

import socket

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.actions import webhooks
from jobs.ledger.transitions import transition
from jobs.loops import deliveries
from jobs.models import Webhook, WebhookDelivery
from jobs.states import JobStatus as S
from jobs.webhooks import targets
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db

NOT_ROUTABLE = [
    ("http://100.100.100.200/latest/meta-data", "a not globally routable address"),
    ("http://100.64.0.1/hook", "a not globally routable address"),
    ("https://100.127.255.254:8443/hook", "a not globally routable address"),
    ("http://[::ffff:100.100.100.200]/hook", "(that is 100.100.100.200)"),
    ("http://[2002:a00:1::]/hook", "2002:a00:1:: (that is 10.0.0.1), a private address"),
    ("http://[64:ff9b::a9fe:a9fe]/hook", "(that is 169.254.169.254), a link-local address"),
    ("http://198.18.0.1/hook", "address"),  # benchmarking
    ("http://192.0.2.1/hook", "address"),  # documentation
]
MALFORMED = [
    ("http://[::1", "is not a well-formed URL"),
    ("http://[zz::1]/", "is not a well-formed URL"),
    ("https://[::1/hook", "is not a well-formed URL"),
    ("http://example.com:99999/", "port"),
]


@pytest.mark.parametrize(("url", "words"), NOT_ROUTABLE + MALFORMED)
def test_the_api_refuses_with_400_and_a_sentence(api, url, words):
    answer = api.post("/webhooks", {"url": url, "on": ["failed"]})
    assert answer.status_code == 400, answer.content
    assert words in answer.json()["detail"]
    assert not Webhook.objects.exists()


@pytest.mark.parametrize(("url", "words"), NOT_ROUTABLE + MALFORMED)
def test_the_console_form_refuses_with_400_and_a_sentence(alice, url, words):
    client = Client()
    client.force_login(alice)
    answer = client.post("/notifications/add/", {"url": url, "on": "failed"})
    assert answer.status_code == 400
    assert words.replace("'", "&#x27;") in answer.content.decode()
    assert not Webhook.objects.exists()


def test_a_global_address_is_accepted(api):
    answer = api.post("/webhooks", {"url": "https://8.8.8.8/hook", "on": ["failed"]})
    assert answer.status_code == 201, answer.content
    assert answer.json()["url"] == "https://8.8.8.8/hook"


def test_a_name_rebound_to_shared_address_space_is_refused_at_delivery(team, alice, monkeypatch):
    answers = {"hooks.example.test": "93.184.215.14"}  # a global address when it is added

    def lookup(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    def no_connection(*args, **kwargs):
        raise AssertionError("a refused target must not be connected to")

    monkeypatch.setattr(targets.socket, "getaddrinfo", lookup)
    monkeypatch.setattr(targets.socket, "create_connection", no_connection)
    hook = webhooks.create(alice, "https://hooks.example.test/x", ["failed"])
    answers["hooks.example.test"] = "100.100.100.200"  # then the metadata service's
    job = with_attempt(queued_job(team, alice), S.RUNNING).job
    transition(job.pk, S.FAILED, actor="test", reason="exited 1")
    deliveries.deliver_due()
    refused = WebhookDelivery.objects.get(webhook=hook)
    assert refused.state == WebhookDelivery.State.GAVE_UP
    assert "100.100.100.200, a not globally routable address" in refused.tries[0]["detail"]


@pytest.mark.parametrize(
    ("url", "allow_private", "words"),
    [
        ("http://[zz::1]/", True, "is not a well-formed URL"),
        ("http://100.100.100.200/x", False, "a not globally routable address"),
        ("http://100.100.100.200/x", True, ""),  # staff may let one reach an inside address
    ],
)
def test_staff_in_the_admin_get_the_same_rule_as_a_sentence(alice, url, allow_private, words):
    staff = User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(staff)
    form = {"owner": alice.pk, "team": "", "url": url, "events": '["failed"]'}
    form |= {"wait_after_s": 3600, **({"allow_private": "on"} if allow_private else {})}
    answer = client.post("/admin/jobs/webhook/add/", form)
    if words:
        assert answer.status_code == 200 and words in answer.content.decode()
        assert not Webhook.objects.exists()
    else:
        assert answer.status_code == 302, answer.content.decode()[:2000]
        assert Webhook.objects.get().allow_private
