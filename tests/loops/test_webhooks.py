"""Notifications (jobs.webhooks): what fires them, who may add them and point them where, and
delivery to a real HTTP receiver on this host (signed, retried with backoff, logged)."""

import datetime as dt
import hashlib
import hmac
import json
import time

import pytest
from django.core import mail
from django.utils import timezone

from jobs.actions import webhooks
from jobs.errors import BadRequest, Forbidden, NotFound
from jobs.ledger import outbox
from jobs.ledger.transitions import transition
from jobs.loops import deliveries
from jobs.models import Webhook, WebhookDelivery
from jobs.reads.preemption import PAUSED_REASON
from jobs.states import JobStatus as S
from jobs.webhooks import send
from tests.factories import queued_job, with_attempt
from tests.receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver(settings):
    settings.SF_WEBHOOK_ALLOWED_NETS = ["127.0.0.0/8"]  # an admin lets them reach this host
    made: list[Receiver] = []

    def make(**kwargs) -> Receiver:
        made.append(Receiver(**kwargs))
        return made[-1]

    yield make
    for r in made:
        r.close()


def run_to(job, *path):
    for status in path:
        transition(job.pk, status, actor="test", reason=f"now {status}")


def ended(job, status=S.FAILED, seconds=120):
    """The job ran `seconds` on its GPUs, then reached `status` through the ledger."""
    now = timezone.now()
    with_attempt(job, S.RUNNING, start_time=now - dt.timedelta(seconds=seconds), end_time=now)
    transition(job.pk, status, actor="test", reason="exited with code 3; last lines:\nboom")


def test_a_failed_job_is_posted_signed_with_its_gpu_seconds_and_link(
    team, alice, receiver, django_capture_on_commit_callbacks, settings
):
    settings.SF_CONSOLE_URL = "https://sf.example.com"
    r = receiver()
    hook = webhooks.create(alice, r.url, ["failed"])
    job = queued_job(team, alice, total_gpus=2, name="resnet")
    with django_capture_on_commit_callbacks():
        ended(job, S.FAILED, seconds=120)
    assert deliveries.deliver_due() == 1
    (request,) = r.requests
    body = request["body"]
    assert request["path"] == "/hook?src=sf"
    # The README's recipe: HMAC-SHA256 of "<t>.<body>" with the secret.
    header = request["headers"]["Starforge-Signature"]
    fields = dict(p.split("=", 1) for p in header.split(","))
    expected = hmac.new(
        hook.secret.encode(), fields["t"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    assert hmac.compare_digest(fields["v1"], expected)
    assert abs(int(fields["t"]) - time.time()) < 60
    assert send.verify(hook.secret, header, body)
    assert not send.verify(hook.secret, header, body + b" ")
    assert not send.verify("0" * 64, header, body)
    payload = json.loads(body)
    assert payload["event"] == "failed" and request["headers"]["Starforge-Event"] == "failed"
    assert request["headers"]["Idempotency-Key"] == payload["id"]
    sent = payload["job"]
    assert (sent["id"], sent["name"], sent["team"], sent["user"]) == (
        job.pk,
        "resnet",
        "vision",
        "alice",
    )
    assert sent["status"] == "FAILED" and sent["reason"].startswith("exited with code 3")
    assert sent["gpu_seconds"] == pytest.approx(240, abs=1)
    assert sent["url"] == f"https://sf.example.com/jobs/{job.pk}/"
    delivery = WebhookDelivery.objects.get()
    assert delivery.state == "delivered" and delivery.tries[0]["status"] == 200


def test_only_the_events_asked_for_fire_and_a_rollback_fires_nothing(team, alice, receiver):
    r = receiver()
    webhooks.create(alice, r.url, ["succeeded"])
    failed = queued_job(team, alice)
    ended(failed, S.FAILED)
    assert not WebhookDelivery.objects.exists()
    try:
        from django.db import transaction

        with transaction.atomic():
            ended(queued_job(team, alice), S.SUCCEEDED)
            raise RuntimeError("the change is rolled back")
    except RuntimeError:
        pass
    assert not WebhookDelivery.objects.exists()
    done = queued_job(team, alice)
    ended(done, S.SUCCEEDED)
    assert list(WebhookDelivery.objects.values_list("job_id", "event")) == [(done.pk, "succeeded")]


def test_scopes_a_users_own_jobs_or_a_whole_team_for_its_admins(
    make_team, make_user, team, alice, receiver
):
    r = receiver()
    bob = make_user("bob", team)
    carol = make_user("carol", team, role="admin")
    mine = webhooks.create(alice, r.url, ["failed"])
    whole = webhooks.create(carol, r.url, ["failed"], team_name="vision")
    other = make_team("audio")
    dave = make_user("dave", other)
    ended(queued_job(team, alice), S.FAILED)
    ended(queued_job(team, bob), S.FAILED)
    ended(queued_job(other, dave), S.FAILED)
    got = sorted(
        (d.webhook_id, d.job.user.username) for d in WebhookDelivery.objects.select_related("job")
    )
    assert got == sorted([(mine.pk, "alice"), (whole.pk, "alice"), (whole.pk, "bob")])
    # An admin demoted is told nothing more of the team's jobs.
    carol.membership_set.update(role="member")
    ended(queued_job(team, bob), S.FAILED)
    assert WebhookDelivery.objects.filter(webhook=whole).count() == 2


def test_only_a_team_admin_adds_a_team_webhook_and_others_see_none(
    make_team, make_user, team, alice, receiver, api_as
):
    r = receiver()
    with pytest.raises(Forbidden, match="only team vision's admins"):
        webhooks.create(alice, r.url, ["failed"], team_name="vision")
    other = make_team("audio")
    with pytest.raises(NotFound, match="does not exist or you are not in it"):
        webhooks.create(alice, r.url, ["failed"], team_name="audio")
    dave = make_user("dave", other, role="admin")
    theirs = webhooks.create(dave, r.url, ["failed"], team_name="audio")
    api = api_as(alice)
    assert api.get("/webhooks").json() == []
    assert api.get(f"/webhooks/{theirs.pk}").status_code == 404
    assert api.client.delete(f"/api/v1/webhooks/{theirs.pk}").status_code == 404
    assert api.post(f"/webhooks/{theirs.pk}/test").status_code == 404
    assert Webhook.objects.filter(pk=theirs.pk).exists()
    assert not WebhookDelivery.objects.exists()


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://127.0.0.1:9/x", "a loopback address"),
        ("http://localhost:9/x", "a loopback address"),
        ("http://[::1]:9/x", "a loopback address"),
        ("http://169.254.169.254/latest/meta-data", "a link-local address"),
        ("http://10.1.2.3/hook", "a private address"),
        ("http://192.168.0.10/hook", "a private address"),
        ("http://[::ffff:127.0.0.1]/hook", "a loopback address"),
        ("http://0.0.0.0:9/x", "address"),
        ("ftp://example.com/x", "is not an http(s) URL or a mailto: address"),
        ("https://user:pw@example.com/x", "no credentials"),
        ("http://no-such-host.invalid/x", "does not resolve"),
        ("mailto:someone@example.com", "sends no email"),
        ("mailto:not-an-address", "is not an email address"),
    ],
)
def test_targets_the_server_must_not_reach_are_refused_with_a_sentence(api, url, words):
    answer = api.post("/webhooks", {"url": url, "on": ["failed"]})
    assert answer.status_code == 400, answer.content
    assert words in answer.json()["detail"]
    assert not Webhook.objects.exists()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"url": "https://example.com/x", "on": ["nonsense"]}, "unknown event 'nonsense'"),
        ({"url": "https://example.com/x", "on": []}, "no event given"),
        ({"url": "https://example.com/x", "on": ["failed"], "wait_after_s": 5}, "60 to 604800"),
    ],
)
def test_bad_events_or_waits_are_refused_and_nothing_is_made(api, body, words):
    answer = api.post("/webhooks", body)
    assert answer.status_code == 400 and words in answer.json()["detail"], answer.content
    assert not Webhook.objects.exists()


def test_an_admin_allows_a_private_target_and_a_rebound_name_is_refused_at_delivery(
    team, alice, receiver, settings, monkeypatch
):
    r = receiver()
    settings.SF_WEBHOOK_ALLOWED_NETS = []
    with pytest.raises(BadRequest, match="loopback"):
        webhooks.create(alice, r.url, ["failed"])
    hook = Webhook.objects.create(
        owner=alice, url=r.url, events=["failed"], secret="s" * 64, allow_private=True
    )  # as staff set it in the admin
    ended(queued_job(team, alice), S.FAILED)
    deliveries.deliver_due()
    assert len(r.requests) == 1
    # Allowed no more (or a public name now resolving to this host): refused at delivery, no
    # retry, said in the log.
    Webhook.objects.filter(pk=hook.pk).update(allow_private=False)
    ended(queued_job(team, alice), S.FAILED)
    deliveries.deliver_due()
    assert len(r.requests) == 1
    refused = WebhookDelivery.objects.order_by("pk").last()
    assert refused.state == "gave-up" and "loopback" in refused.tries[0]["detail"]


def test_a_failing_receiver_is_retried_with_backoff_under_one_key_until_it_answers(
    team, alice, receiver
):
    r = receiver(fail_first=2)
    webhooks.create(alice, r.url, ["succeeded"])
    ended(queued_job(team, alice), S.SUCCEEDED)
    now = timezone.now()
    deliveries.deliver_due(now=now)
    delivery = WebhookDelivery.objects.get()
    assert delivery.state == "pending" and delivery.tries[0]["status"] == 500
    first_wait = (delivery.next_at - now).total_seconds()
    assert deliveries.deliver_due(now=now + dt.timedelta(seconds=first_wait - 1)) == 0  # not due
    later = now + dt.timedelta(seconds=first_wait)
    deliveries.deliver_due(now=later)
    delivery.refresh_from_db()
    second_wait = (delivery.next_at - later).total_seconds()
    assert second_wait == 2 * first_wait  # exponential
    deliveries.deliver_due(now=later + dt.timedelta(seconds=second_wait))
    delivery.refresh_from_db()
    assert delivery.state == "delivered"
    assert [t["status"] for t in delivery.tries] == [500, 500, 200]
    keys = {q["headers"]["Idempotency-Key"] for q in r.requests}
    bodies = {q["body"] for q in r.requests}
    assert keys == {delivery.key} and len(bodies) == 1  # the same payload every try


def test_an_unreachable_receiver_never_blocks_the_job_and_is_given_up_after_a_day(team, alice):
    hook = Webhook.objects.create(
        owner=alice, url="http://127.0.0.1:9/x", events=["failed"], secret="k" * 64
    )
    hook.allow_private = True
    hook.save()
    job = queued_job(team, alice)
    ended(job, S.FAILED)  # the ledger's write does not wait for any receiver
    now = timezone.now()
    deliveries.deliver_due(now=now)
    delivery = WebhookDelivery.objects.get()
    assert delivery.state == "pending" and delivery.tries[0]["status"] is None
    assert "ConnectionRefusedError" in delivery.tries[0]["detail"]
    moment = now
    for _ in range(60):
        delivery.refresh_from_db()
        if delivery.state != "pending":
            break
        moment = delivery.next_at
        deliveries.deliver_due(now=moment)
    assert delivery.state == "gave-up"
    assert dt.timedelta(hours=20) < moment - now <= dt.timedelta(days=1)
    assert 10 < len(delivery.tries) < 40


def test_a_lease_keeps_two_senders_from_sending_one_delivery(team, alice, receiver):
    r = receiver()
    webhooks.create(alice, r.url, ["failed"])
    ended(queued_job(team, alice), S.FAILED)
    now = timezone.now()
    # A sender claimed it and died before recording anything: the lease holds it back.
    WebhookDelivery.objects.update(next_at=now + dt.timedelta(seconds=deliveries.LEASE_S))
    assert deliveries.deliver_due(now=now) == 0 and not r.requests
    assert deliveries.deliver_due(now=now + dt.timedelta(seconds=deliveries.LEASE_S)) == 1
    assert len(r.requests) == 1


def test_a_preemptions_pause_fires_preempted_and_a_persons_pause_does_not(team, alice, receiver):
    r = receiver()
    webhooks.create(alice, r.url, ["preempted"])
    paused = queued_job(team, alice)
    with_attempt(paused, S.RUNNING, start_time=timezone.now())
    transition(paused.pk, S.PAUSED, actor="alice", reason="paused by alice")
    preempted = queued_job(team, alice)
    attempt = with_attempt(preempted, S.RUNNING, start_time=timezone.now())
    attempt.preempted_at = timezone.now()
    attempt.save()
    transition(preempted.pk, S.PAUSED, actor="reconciler", reason=PAUSED_REASON)
    assert list(WebhookDelivery.objects.values_list("job_id", "event")) == [
        (preempted.pk, "preempted")
    ]
    deliveries.deliver_due()
    assert json.loads(r.requests[0]["body"])["job"]["reason"].startswith("preempted")


def test_waiting_too_long_is_told_once_per_stay_in_the_queue(team, alice, receiver):
    r = receiver()
    webhooks.create(alice, r.url, ["waiting-too-long"], wait_after_s=600)
    job = queued_job(team, alice)
    now = timezone.now()
    assert outbox.notify_waiting(now + dt.timedelta(seconds=599)) == 0
    assert outbox.notify_waiting(now + dt.timedelta(seconds=601)) == 1
    assert outbox.notify_waiting(now + dt.timedelta(seconds=900)) == 0  # told already
    deliveries.deliver_due(now=now + dt.timedelta(seconds=901))
    sent = json.loads(r.requests[0]["body"])
    assert sent["event"] == "waiting-too-long" and sent["job"]["id"] == job.pk
    assert "has waited in the queue" in send.summary(sent)


def test_a_slack_url_gets_slacks_body():
    body = {
        "id": "k",
        "event": "failed",
        "created_at": "2026-12-03T08:00:00+00:00",
        "job": {
            "id": 7,
            "name": "",
            "run_id": "run7",
            "team": "vision",
            "status": "FAILED",
            "reason": "exited with code 1; last lines:\nboom",
            "gpu_seconds": 7200.0,
            "status_changed_at": "2026-12-03T08:00:00+00:00",
            "url": "https://sf.example.com/jobs/7/",
        },
    }
    assert send.is_slack("https://hooks.slack.com/services/T0/B0/xyz")
    assert not send.is_slack("https://hooks.slack.com.evil.example/services/x")
    assert send.slack_text("boom <!channel> & <https://x|y>") == (
        "boom &lt;!channel&gt; &amp; &lt;https://x|y&gt;"
    )
    text = send.summary(body)
    assert text == (
        "Starforge job 7 (run7, team vision) is FAILED: exited with code 1 — 2.00 GPU-hours. "
        "https://sf.example.com/jobs/7/"
    )


def test_email_goes_through_djangos_backend_when_it_is_set_up(team, alice, settings):
    settings.SF_NOTIFY_EMAIL = True
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    webhooks.create(alice, "mailto:alice@example.com", ["stopped"])
    job = queued_job(team, alice)
    ended(job, S.STOPPED)
    deliveries.deliver_due()
    (message,) = mail.outbox
    assert message.to == ["alice@example.com"] and f"job {job.pk}" in message.subject
    assert WebhookDelivery.objects.get().state == "delivered"


def test_the_api_adds_shows_tests_and_removes_a_webhook(api, receiver, team, alice):
    r = receiver()
    made = api.post("/webhooks", {"url": r.url, "on": ["failed", "succeeded"]})
    assert made.status_code == 201, made.content
    hook = made.json()
    assert (hook["scope"], hook["on"], hook["kind"]) == ("mine", ["succeeded", "failed"], "json")
    assert len(hook["secret"]) == 64
    tested = api.post(f"/webhooks/{hook['id']}/test")
    assert tested.status_code == 202 and tested.json()["event"] == "test"
    deliveries.deliver_due()
    assert json.loads(r.requests[0]["body"])["event"] == "test"
    shown = api.get(f"/webhooks/{hook['id']}").json()
    assert shown["deliveries"][0]["state"] == "delivered"
    assert shown["deliveries"][0]["tries"][0]["status"] == 200
    assert [h["id"] for h in api.get("/webhooks").json()] == [hook["id"]]
    assert api.client.delete(f"/api/v1/webhooks/{hook['id']}").status_code == 204
    assert not Webhook.objects.exists() and not WebhookDelivery.objects.exists()


def test_no_one_has_more_than_the_most_webhooks(alice, receiver):
    r = receiver()
    for _ in range(webhooks.MAX_PER_OWNER):
        webhooks.create(alice, r.url, ["failed"])
    with pytest.raises(BadRequest, match="the most one person may have"):
        webhooks.create(alice, r.url, ["failed"])
    assert Webhook.objects.count() == webhooks.MAX_PER_OWNER


def test_a_change_nobody_asked_about_costs_the_ledger_one_read(team, alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = queued_job(team, alice)
    with_attempt(job, S.RUNNING, start_time=timezone.now())
    with CaptureQueriesContext(connection) as seen:
        transition(job.pk, S.SUCCEEDED, actor="test")
    touching = [q["sql"] for q in seen.captured_queries if "webhook" in q["sql"].lower()]
    assert len(touching) == 1, touching


def test_the_task_the_ledger_sends_by_name_exists():
    from jobs import tasks

    assert tasks.deliver_webhooks.name == outbox.DELIVER_TASK


def test_one_sweep_sends_every_due_delivery_a_few_claims_at_a_time(team, alice, receiver):
    r = receiver()
    webhooks.create(alice, r.url, ["failed"])
    for _ in range(deliveries.CLAIM * 2 + 1):
        ended(queued_job(team, alice), S.FAILED)
    assert deliveries.deliver_due() == deliveries.CLAIM * 2 + 1
    assert len(r.requests) == deliveries.CLAIM * 2 + 1
    assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {"delivered"}
