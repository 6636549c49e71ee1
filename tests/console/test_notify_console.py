"""The console's Notifications page (/notifications/): a user's webhooks and those of the teams
they admin, forms to add, test and remove them (the rules are jobs.webhooks'), and each one's
delivery log."""

import datetime as dt
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.console.notify import RECENT_DELIVERIES
from jobs.models import Webhook, WebhookDelivery
from tests.factories import queued_job

pytestmark = pytest.mark.django_db

HOOK_URL = "http://127.0.0.1:9/hook"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def hook(owner, team=None, url="https://hooks.example.com/x", events=("failed",)) -> Webhook:
    return Webhook.objects.create(
        owner=owner, team=team, url=url, events=list(events), secret=f"secret-of-{owner}-{url}"
    )


def shown_ids(page: str) -> set[int]:
    return {int(n) for n in re.findall(r'id="webhook-(\d+)"', page)}


@pytest.fixture(autouse=True)
def _loopback_allowed(settings):
    """The test target lives on loopback, which the SSRF check refuses unless allowed."""
    settings.SF_WEBHOOK_ALLOWED_NETS = ["127.0.0.0/8"]


@pytest.fixture
def admin(make_user, team):
    return make_user("ada", team, role="admin")


@pytest.fixture
def nlp(make_team):
    return make_team("nlp")


def test_the_page_needs_a_signed_in_user_and_is_in_the_nav(alice):
    assert Client().get("/notifications/").url.startswith("/accounts/login/")
    assert (
        Client().post("/notifications/add/", {"url": HOOK_URL}).url.startswith("/accounts/login/")
    )
    assert 'href="/notifications/"' in signed_in(alice).get("/").content.decode()


def test_the_page_lists_mine_and_my_admin_teams_webhooks_only(admin, alice, team, nlp, make_user):
    eve = make_user("eve", team, role="admin")
    nina = make_user("nina", nlp, role="admin")
    mine = hook(admin, url="https://hooks.example.com/mine")
    teams = hook(eve, team=team, url="https://hooks.example.com/vision-team")
    hook(eve, url="https://hooks.example.com/eve-own")  # eve's own jobs: not ada's business
    hook(alice, url="https://hooks.example.com/alice-own")
    other = hook(nina, team=nlp, url="https://hooks.example.com/nlp-team")
    page = signed_in(admin).get("/notifications/").content.decode()
    assert shown_ids(page) == {mine.pk, teams.pk}
    assert "hooks.example.com/vision-team" in page and "every job of team vision" in page
    assert "nlp-team" not in page and "eve-own" not in page and "alice-own" not in page
    assert teams.secret in page.split("<details>")[2]  # the secret, folded away
    member_page = signed_in(alice).get("/notifications/").content.decode()
    assert shown_ids(member_page) == {Webhook.objects.get(owner=alice).pk}
    assert other.pk not in shown_ids(member_page)


def test_another_teams_webhook_cannot_be_tested_or_removed(admin, nlp, make_user):
    other = hook(make_user("nina", nlp, role="admin"), team=nlp)
    client = signed_in(admin)
    assert client.post(f"/notifications/{other.pk}/test/").status_code == 404
    assert client.post(f"/notifications/{other.pk}/remove/").status_code == 404
    assert client.post("/notifications/999999/remove/").status_code == 404
    assert Webhook.objects.filter(pk=other.pk).exists()
    assert not WebhookDelivery.objects.exists()


def test_staff_see_every_webhook_and_may_scope_one_to_any_team(alice, nlp, make_user):
    staff = make_user("root")
    staff.is_staff = True
    staff.save()
    theirs = hook(alice)
    page = signed_in(staff).get("/notifications/").content.decode()
    assert theirs.pk in shown_ids(page) and "the jobs of alice" in page
    assert '<option value="nlp">' in page and '<option value="vision">' in page


def test_adding_through_the_form_creates_the_webhook(admin):
    client = signed_in(admin)
    form = {"url": HOOK_URL, "on": ["failed", "waiting-too-long"], "wait_after_min": "5"}
    page = client.post("/notifications/add/", form, follow=True).content.decode()
    made = Webhook.objects.get(owner=admin)
    assert (made.team, made.events, made.wait_after_s) == (None, form["on"], 300)
    assert len(made.secret) == 64
    assert f"webhook {made.pk} added" in page
    assert made.pk in shown_ids(page) and "my jobs" in page and "(after 5 min)" in page


def test_an_admin_adds_a_webhook_for_their_team(admin, team):
    client = signed_in(admin)
    page = client.get("/notifications/").content.decode()
    assert '<option value="vision">every job of team vision</option>' in page
    response = client.post("/notifications/add/", {"url": HOOK_URL, "on": "stopped", "team": ""})
    assert response.status_code == 302
    client.post("/notifications/add/", {"url": HOOK_URL, "on": "succeeded", "team": "vision"})
    made = Webhook.objects.get(owner=admin, team=team)
    assert made.events == ["succeeded"] and made.wait_after_s == 3600  # the default
    assert Webhook.objects.filter(owner=admin, team=None, events=["stopped"]).exists()


@pytest.mark.parametrize(
    "form, sentence",
    [
        ({"url": "ftp://x", "on": "failed"}, "is not an http(s) URL or a mailto: address"),
        ({"url": HOOK_URL}, "no event given: say which of succeeded, failed"),
        ({"url": HOOK_URL, "on": "exploded"}, "unknown event &#x27;exploded&#x27;"),
        (
            {"url": HOOK_URL, "on": "failed", "wait_after_min": "soon"},
            "must be a whole number of minutes",
        ),
        ({"url": HOOK_URL, "on": "failed", "wait_after_min": "0"}, "wait_after_s must be 60"),
        ({"url": "http://10.1.2.3/x", "on": "failed"}, "a private address"),
    ],
)
def test_a_bad_form_answers_400_with_the_sentence_and_creates_nothing(admin, form, sentence):
    response = signed_in(admin).post("/notifications/add/", form)
    assert response.status_code == 400
    page = response.content.decode()
    assert sentence in page
    assert f'value="{form["url"]}"' in page  # the form as it was filled in
    assert not Webhook.objects.exists()


def test_a_member_who_is_not_admin_cannot_scope_a_webhook_to_the_team(alice, nlp):
    client = signed_in(alice)
    assert "every job of team" not in client.get("/notifications/").content.decode()
    refused = client.post(
        "/notifications/add/", {"url": HOOK_URL, "on": "failed", "team": "vision"}
    )
    assert refused.status_code == 403
    not_mine = client.post("/notifications/add/", {"url": HOOK_URL, "on": "failed", "team": "nlp"})
    assert not_mine.status_code == 404
    assert not Webhook.objects.exists()


def test_send_test_creates_a_delivery_shown_in_the_log(admin):
    mine = hook(admin)
    page = signed_in(admin).post(f"/notifications/{mine.pk}/test/", follow=True).content.decode()
    delivery = WebhookDelivery.objects.get(webhook=mine)
    assert delivery.event == "test" and delivery.state == "pending"
    assert f"test delivery {delivery.pk} to webhook {mine.pk} queued" in page
    log = page.split('class="deliveries"')[1]
    assert '<tr class="delivery-pending">' in log and "<td>test</td>" in log
    assert "not tried yet" in log and "No deliveries yet." not in log


def test_the_log_shows_each_try_and_links_the_job(admin, alice, team):
    mine = hook(admin, team=team)
    job = queued_job(team, alice)
    now = timezone.now()
    WebhookDelivery.objects.create(
        webhook=mine,
        job=job,
        event="failed",
        key=f"{job.pk}-failed-1",
        state=WebhookDelivery.State.DELIVERED,
        delivered_at=now,
        tries=[
            {
                "at": "2030-01-02T03:04:05+00:00",
                "status": None,
                "ok": False,
                "detail": "ConnectionRefusedError: [Errno 111] Connection refused",
                "ms": 2,
            },
            {
                "at": "2030-01-02T03:04:20+00:00",
                "status": 503,
                "ok": False,
                "detail": "HTTP 503 Service Unavailable",
                "ms": 40,
            },
            {
                "at": "2030-01-02T03:04:50+00:00",
                "status": 200,
                "ok": True,
                "detail": "HTTP 200 OK",
                "ms": 9,
            },
        ],
    )
    page = signed_in(admin).get("/notifications/").content.decode()
    log = page.split('class="deliveries"')[1]
    assert f'<a href="/jobs/{job.pk}/">{job.pk}</a>' in log
    assert '<tr class="delivery-delivered">' in log
    tries = re.findall(r"<li>(.*?)</li>", log.split("</table>")[0])
    assert len(tries) == 3
    assert "2030-01-02T03:04:05" in tries[0] and "—" in tries[0]
    assert "Connection refused" in tries[0]
    assert "HTTP 503 · HTTP 503 Service Unavailable" in tries[1]
    assert "HTTP 200 · HTTP 200 OK" in tries[2]


def test_only_the_latest_deliveries_are_shown_newest_first(admin):
    mine = hook(admin)
    start = timezone.now() - dt.timedelta(hours=1)
    WebhookDelivery.objects.bulk_create(
        WebhookDelivery(
            webhook=mine, event="test", key=f"k{i}", created_at=start + dt.timedelta(minutes=i)
        )
        for i in range(25)
    )
    newest = WebhookDelivery.objects.filter(webhook=mine).order_by("-pk")[:RECENT_DELIVERIES]
    page = signed_in(admin).get("/notifications/").content.decode()
    shown = re.findall(r'<tr class="delivery-pending">\s*<td><time datetime="([^"]+)"', page)
    assert RECENT_DELIVERIES == 20
    assert shown == [d.created_at.isoformat() for d in newest]


def test_the_page_reads_deliveries_in_one_query_however_many_webhooks(admin, team):
    def queries() -> int:
        client = signed_in(admin)
        client.get("/notifications/")  # the session, warmed up
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/notifications/").status_code == 200
        return len(captured)

    first = hook(admin)
    WebhookDelivery.objects.create(webhook=first, event="test", key="a")
    one = queries()
    for n in range(4):
        more = hook(admin, team=team if n % 2 else None, url=f"https://hooks.example.com/{n}")
        WebhookDelivery.objects.create(webhook=more, event="test", key=f"b{n}")
    assert queries() == one
    assert len(shown_ids(signed_in(admin).get("/notifications/").content.decode())) == 5


def test_remove_deletes_the_webhook_and_its_log(admin):
    mine = hook(admin)
    WebhookDelivery.objects.create(webhook=mine, event="test", key="t")
    client = signed_in(admin)
    assert "return confirm(" in client.get("/notifications/").content.decode()
    page = client.post(f"/notifications/{mine.pk}/remove/", follow=True).content.decode()
    assert f"webhook {mine.pk} and its delivery log removed" in page
    assert not Webhook.objects.exists() and not WebhookDelivery.objects.exists()
    assert "No webhooks yet." in page


def test_the_forms_are_post_only_and_csrf_protected(admin):
    mine = hook(admin)
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)
    client.get("/notifications/")
    for path in ("/notifications/add/", f"/notifications/{mine.pk}/test/"):
        assert client.get(path).status_code == 405
    assert client.post(f"/notifications/{mine.pk}/remove/").status_code == 403
    assert client.post("/notifications/add/", {"url": HOOK_URL, "on": "failed"}).status_code == 403
    assert Webhook.objects.count() == 1
    token = {"csrfmiddlewaretoken": client.cookies["csrftoken"].value}
    assert client.post(f"/notifications/{mine.pk}/test/", token).status_code == 302
    assert WebhookDelivery.objects.filter(webhook=mine).count() == 1
    assert client.post(f"/notifications/{mine.pk}/remove/", token).status_code == 302
    assert not Webhook.objects.exists()
