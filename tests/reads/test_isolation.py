"""Team isolation over the whole URL map: a user never sees, streams, controls or meters another
team's jobs, and a viewer reads but never controls.

`ROUTES` has one entry per route of the project: the console's URL patterns, every operation of
the API and every websocket route. `test_every_route_has_an_entry` compares it with the routes
the project really serves, so a new endpoint without a check (or a stale entry) fails the suite.
An entry is either a `Check` (what bob, a member of another team, gets when he reaches for
alice's job or team; and what vic, a viewer of alice's team, gets) or an `Exempt` with a reason.
"""

import datetime as dt
import json
from collections.abc import Callable
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from jobs.actions.tokens import create_token
from jobs.ledger.transitions import transition
from jobs.models import (
    ApiToken,
    Cluster,
    ClusterGrant,
    GpuPrice,
    Job,
    JobArray,
    JobEvent,
    Webhook,
    WebhookDelivery,
)
from jobs.states import JobStatus
from jobs.stores import logstore
from jobs.stores.metrics import ingest
from starforge.api import api as ninja_api
from starforge.asgi import websocket_urlpatterns
from tests.factories import queued_job, with_attempt
from tests.reads.isolation import (
    SECRET_LINE,
    SECRET_METRIC,
    SECRET_NAME,
    SECRET_TOKEN,
    VERBS,
    Check,
    Exempt,
    Probe,
    World,
    absent,
    api_control,
    api_read,
    body,
    console_control,
    hidden,
    leaks,
    send,
    shows,
    untouched,
)
from tests.sockets import close_code, session_of, socket


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    """Four users per test: PBKDF2's deliberate slowness would dominate the suite."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# -- the world: team vision (alice, member; vic, viewer) and team nlp (bob) -----------------------


@pytest.fixture
def world(make_team, make_user) -> World:
    vision, nlp = make_team("vision"), make_team("nlp")
    alice = make_user("alice", vision)
    make_user("ada", vision, role="admin")
    vic = make_user("vic", vision, role="viewer")
    bob = make_user("bob", nlp, role="admin")  # an admin of his own team, to show it is no key
    queued_job(nlp, bob, name="bobs-run")
    job = queued_job(vision, alice, name=SECRET_NAME)
    with_attempt(job, JobStatus.RUNNING, start_time=timezone.now() - dt.timedelta(hours=1))
    JobEvent.objects.create(job=job, kind=JobEvent.Kind.NOTE, reason="alice's note", actor="a")
    lines = [{"seq": 0, "stream": "stdout", "ts": 1.0, "text": SECRET_LINE}]
    logstore.append(job.pk, 1, lines)
    point = {"seq": 0, "kind": "train", "name": SECRET_METRIC, "step": 1, "value": 0.5, "ts": 1.0}
    ingest.append(job.pk, 1, [point])
    token, _ = create_token(alice, SECRET_TOKEN)
    job.refresh_from_db()
    return World(team=vision, job=job, token=token, bob=bob, vic=vic)


# -- the probes that need more than one request ----------------------------------------------------


def job_list_outsider(w: World) -> None:
    client = w.api(w.bob)
    absent(client.get("/api/v1/jobs"), w)
    page = client.get("/api/v1/jobs", {"team": "vision", "user": "alice"})
    assert page.status_code == 200 and page.json()["items"] == []


def console_list_outsider(w: World) -> None:
    client = w.console(w.bob)
    absent(client.get("/"), w)
    absent(client.get("/", {"team": "vision", "q": "alice"}), w, team_too=False)


def console_verbs_outsider(w: World) -> None:
    client = w.console(w.bob)
    for verb in VERBS:
        hidden(client.post(f"/jobs/{w.job.pk}/{verb}/"), w)
        hidden(client.post(f"/jobs/{w.job.pk}/{verb}/", HTTP_ACCEPT="application/json"), w)
    untouched(w)


def console_verbs_viewer(w: World) -> None:
    client = w.console(w.vic)
    for verb in VERBS:
        assert client.post(f"/jobs/{w.job.pk}/{verb}/").status_code == 403
        refused = client.post(f"/jobs/{w.job.pk}/{verb}/", HTTP_ACCEPT="application/json")
        assert refused.status_code == 403 and "viewer" in refused.json()["detail"]
    untouched(w)


def console_job_viewer(w: World) -> None:
    page = w.console(w.vic).get(f"/jobs/{w.job.pk}/")
    shows(page, SECRET_NAME, "is viewer: you can read this job only")
    assert "<button" in body(page) and " disabled " in body(page)


def submit_outsider(w: World) -> None:
    response = send(w.api(w.bob), "POST", "/api/v1/jobs", {"entrypoint": ["x"], "team": "vision"})
    assert response.status_code == 403, response.content
    assert not Job.objects.filter(team=w.team, user=w.bob).exists()


def submit_viewer(w: World) -> None:
    response = send(w.api(w.vic), "POST", "/api/v1/jobs", {"entrypoint": ["x"], "team": "vision"})
    assert response.status_code == 403 and "viewer" in response.json()["detail"]
    assert not Job.objects.filter(team=w.team, user=w.vic).exists()


def token_create_outsider(w: World) -> None:
    created = send(w.api(w.bob), "POST", "/api/v1/tokens", {"name": "bobs"}).json()
    assert ApiToken.objects.get(pk=created["id"]).user == w.bob
    me = Client(HTTP_AUTHORIZATION=f"Bearer {created['secret']}").get("/api/v1/me").json()
    assert me["username"] == "bob"


def token_revoke_outsider(w: World) -> None:
    hidden(w.api(w.bob).delete(f"/api/v1/tokens/{w.token.pk}"), w)
    hidden(w.console(w.bob).post(f"/tokens/{w.token.pk}/revoke/"), w)
    untouched(w)


def metrics_endpoint_outsider(w: World) -> None:
    # Only the scrape token, staff tokens and networks an admin trusts read every team's
    # counts; loopback is not trusted by default (local jobs share it).
    token = create_token(w.bob, "scrape")[1]
    for where in ({"REMOTE_ADDR": "203.0.113.9"}, {"REMOTE_ADDR": "127.0.0.1"}):
        assert Client().get("/metrics", **where).status_code == 401
        refused = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/metrics", **where)
        assert refused.status_code == 403 and "vision" not in body(refused)


def vision_webhook(w: World) -> Webhook:
    """A webhook of alice's team, set up by its admin ada."""
    return Webhook.objects.create(
        owner=User.objects.get(username="ada"),
        team=w.team,
        url="https://hooks.example.com/vision-alerts",
        events=["failed"],
        secret="s" * 64,
    )


def notifications_outsider(w: World) -> None:
    vision_webhook(w)
    absent(w.console(w.bob).get("/notifications/"), w)


def notifications_viewer(w: World) -> None:
    vision_webhook(w)
    page = w.console(w.vic).get("/notifications/")
    shows(page, "No webhooks yet.")
    assert "vision-alerts" not in body(page) and "every job of team" not in body(page)


def notification_add_outsider(w: World) -> None:
    form = {"url": "https://hooks.example.com/x", "on": "failed", "team": "vision"}
    hidden(w.console(w.bob).post("/notifications/add/", form), w)
    assert not Webhook.objects.exists()


def notification_add_viewer(w: World) -> None:
    form = {"url": "https://hooks.example.com/x", "on": "failed", "team": "vision"}
    assert w.console(w.vic).post("/notifications/add/", form).status_code == 403
    assert not Webhook.objects.exists()


def notification_control(action: str) -> Check:
    """Testing or removing the team's webhook: 404 for bob and for vic (not its admin)."""

    def probe(user: Callable[[World], User]) -> Probe:
        def check(w: World) -> None:
            hook = vision_webhook(w)
            hidden(w.console(user(w)).post(f"/notifications/{hook.pk}/{action}/"), w)
            assert Webhook.objects.filter(pk=hook.pk).exists()
            assert not WebhookDelivery.objects.exists()
            untouched(w)

        return check

    return Check(probe(lambda w: w.bob), probe(lambda w: w.vic))


def vision_array(w: World) -> JobArray:
    """An array of alice's with two queued tasks."""
    alice = User.objects.get(username="alice")
    array = JobArray.objects.create(
        team=w.team, user=alice, name=f"{SECRET_NAME}-sweep", spec="0-1", size=2
    )
    for index in range(2):
        queued_job(w.team, alice, name=f"{SECRET_NAME}[{index}]", array=array, array_index=index)
    return array


def arrays_listed(w: World) -> None:
    vision_array(w)
    absent(w.api(w.bob).get("/api/v1/arrays"), w)
    shows(w.api(w.vic).get("/api/v1/arrays"), f"{SECRET_NAME}-sweep")


def array_submit_refused(w: World) -> None:
    data = {"entrypoint": ["x"], "team": "vision", "array": "0-3"}
    for user, words in ((w.bob, "not a member"), (w.vic, "viewer")):
        refused = send(w.api(user), "POST", "/api/v1/arrays", data)
        assert refused.status_code == 403 and words in body(refused), body(refused)
    assert not JobArray.objects.exists()


def array_read(w: World) -> None:
    array = vision_array(w)
    hidden(w.api(w.bob).get(f"/api/v1/arrays/{array.pk}"), w)


def array_read_viewer(w: World) -> None:
    array = vision_array(w)
    shows(w.api(w.vic).get(f"/api/v1/arrays/{array.pk}"), f"{SECRET_NAME}-sweep")


def array_verbs(w: World) -> None:
    """Every verb on alice's array: 404 for bob, 403 for vic; no task moves."""
    array = vision_array(w)
    for verb in VERBS:
        hidden(send(w.api(w.bob), "POST", f"/api/v1/arrays/{array.pk}/{verb}"), w)
        refused = send(w.api(w.vic), "POST", f"/api/v1/arrays/{array.pk}/{verb}")
        assert refused.status_code == 403 and "viewer" in body(refused), body(refused)
    assert set(Job.objects.filter(array=array).values_list("status", flat=True)) == {"QUEUED"}
    untouched(w)


def array_page(w: World) -> None:
    array = vision_array(w)
    hidden(w.console(w.bob).get(f"/arrays/{array.pk}/"), w)


def array_page_viewer(w: World) -> None:
    array = vision_array(w)
    page = w.console(w.vic).get(f"/arrays/{array.pk}/")
    shows(page, f"{SECRET_NAME}-sweep", "2 QUEUED")
    assert "Stop all" not in body(page)  # a viewer gets no verbs


def array_page_verbs(w: World) -> None:
    array = vision_array(w)
    for verb in VERBS:
        hidden(w.console(w.bob).post(f"/arrays/{array.pk}/{verb}/"), w)
        assert w.console(w.vic).post(f"/arrays/{array.pk}/{verb}/").status_code == 403
    assert set(Job.objects.filter(array=array).values_list("status", flat=True)) == {"QUEUED"}
    untouched(w)


def compare_page(w: World) -> None:
    """Alice's job next to bob's own: the whole page is a 404, as if it were missing."""
    bobs = Job.objects.get(name="bobs-run")
    for ids in (f"{bobs.pk},{w.job.pk}", f"{w.job.pk},{bobs.pk}"):
        hidden(w.console(w.bob).get("/compare/", {"jobs": ids}), w)
    missing = w.console(w.bob).get("/compare/", {"jobs": f"{bobs.pk},{w.job.pk + 1000}"})
    assert missing.status_code == 404


def compare_page_viewer(w: World) -> None:
    other = queued_job(w.team, User.objects.get(username="alice"), name="alice-other-run")
    page = w.console(w.vic).get("/compare/", {"jobs": f"{w.job.pk},{other.pk}"})
    shows(page, SECRET_NAME, SECRET_METRIC, "alice-other-run")


def webhooks_listed(w: World) -> None:
    vision_webhook(w)
    for user in (w.bob, w.vic):
        answer = w.api(user).get("/api/v1/webhooks")
        assert answer.status_code == 200 and answer.json() == [], body(answer)


def webhook_add_refused(w: World) -> None:
    """A team webhook of vision's: 404 for bob (not in it), 403 for vic (not its admin)."""
    data = {"url": "https://hooks.example.com/x", "on": ["failed"], "team": "vision"}
    hidden(send(w.api(w.bob), "POST", "/api/v1/webhooks", data), w)
    refused = send(w.api(w.vic), "POST", "/api/v1/webhooks", data)
    assert refused.status_code == 403 and "admins" in body(refused), body(refused)
    assert not Webhook.objects.exists()


def webhook_api_control(method: str, suffix: str = "") -> Check:
    """Reading, testing or removing vision's webhook: 404 for bob and vic, nothing changes and
    its secret never shows."""

    def probe(user: Callable[[World], User]) -> Probe:
        def check(w: World) -> None:
            hook = vision_webhook(w)
            answer = send(w.api(user(w)), method, f"/api/v1/webhooks/{hook.pk}{suffix}")
            hidden(answer, w)
            assert hook.secret not in body(answer)
            assert Webhook.objects.filter(pk=hook.pk).exists()
            assert not WebhookDelivery.objects.exists()

        return check

    return Check(probe(lambda w: w.bob), probe(lambda w: w.vic))


def usage_api_outsider(w: World) -> None:
    client = w.api(w.bob)
    for by in ("team", "user", "cluster", "day"):
        absent(client.get("/api/v1/usage", {"by": by}), w)
    hidden(client.get("/api/v1/usage", {"team": "vision"}), w)


def usage_api_viewer(w: World) -> None:
    rows = w.api(w.vic).get("/api/v1/usage", {"team": "vision", "by": "user"}).json()["rows"]
    assert [row["user"] for row in rows] == ["alice"] and rows[0]["gpu_seconds"] > 0


def usage_page_outsider(w: World) -> None:
    client = w.console(w.bob)
    absent(client.get("/usage/"), w)
    absent(client.get("/usage/", {"format": "csv"}), w)
    hidden(client.get("/usage/", {"team": "vision"}), w)
    hidden(client.get("/usage/", {"team": "vision", "format": "csv"}), w)


def usage_page_viewer(w: World) -> None:
    shows(w.console(w.vic).get("/usage/", {"team": "vision", "format": "csv"}), "vision", "alice")


# -- websockets ----------------------------------------------------------------------------------


async def job_socket_outsider(w: World) -> None:
    assert await close_code(socket(f"/ws/jobs/{w.job.pk}/", await _session(w.bob))) == 4404


async def job_socket_viewer(w: World) -> None:
    page = socket(f"/ws/jobs/{w.job.pk}/", await _session(w.vic))
    assert (await page.connect())[0]
    await _stop_alices_job(w)
    assert (await page.receive_json_from())["status"] == JobStatus.STOPPED
    await page.disconnect()


async def list_socket_outsider(w: World) -> None:
    listing = socket("/ws/jobs/", await _session(w.bob))
    assert (await listing.connect())[0]
    await _stop_alices_job(w)
    bobs = await database_sync_to_async(Job.objects.get)(name="bobs-run")
    await database_sync_to_async(transition)(bobs.pk, JobStatus.STOPPED, reason="r", actor="bob")
    message = await listing.receive_json_from()  # his own job's change arrives, alice's never
    assert message["job"] == bobs.pk
    assert await listing.receive_nothing(timeout=0.3)
    await listing.disconnect()


async def list_socket_viewer(w: World) -> None:
    listing = socket("/ws/jobs/", await _session(w.vic))
    assert (await listing.connect())[0]
    await _stop_alices_job(w)
    assert (await listing.receive_json_from())["job"] == w.job.pk
    await listing.disconnect()


async def _session(user: User) -> str:
    return await database_sync_to_async(session_of)(user)


async def _stop_alices_job(w: World) -> None:
    await database_sync_to_async(transition)(
        w.job.pk, JobStatus.STOPPED, reason="stopped by alice", actor="alice"
    )


# -- the table -----------------------------------------------------------------------------------


def export_rows(w: World, user: User) -> list[dict]:
    response = send(w.api(user), "GET", "/api/v1/usage/export", {"format": "json"})
    assert response.status_code == 200, response.content
    return response.json()["rows"]


def export_outsider(w: World) -> None:
    """Another team's admin exports none of alice's attempts (the accounting export)."""
    assert str(w.job.pk) not in {row["JobID"] for row in export_rows(w, w.bob)}


def export_viewer(w: World) -> None:
    """A viewer of alice's team is no team admin: their export holds only their own attempts."""
    assert str(w.job.pk) not in {row["JobID"] for row in export_rows(w, w.vic)}


# -- MLflow, prices and money budgets --------------------------------------------------------------


def mlflow_run_outsider(w: World) -> None:
    """Bob's token through MLflow's own API: alice's run is one that does not exist."""
    path = f"/mlflow/api/2.0/mlflow/runs/get?run_id={w.job.pk}-1"
    response = send(w.api(w.bob), "GET", path)
    assert response.status_code == 404, response.content
    assert json.loads(response.content)["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    assert not leaks(body(response), w)


def mlflow_run_viewer(w: World) -> None:
    path = f"/mlflow/api/2.0/mlflow/runs/get?run_id={w.job.pk}-1"
    response = send(w.api(w.vic), "GET", path)
    assert response.status_code == 200, response.content
    assert json.loads(response.content)["run"]["info"]["run_id"] == f"{w.job.pk}-1"


def vision_only_price(w: World) -> GpuPrice:
    """A price on a cluster only team vision may use."""
    cluster = Cluster.objects.create(name="vision-only", kind="noop", settings={"gpus": 8})
    ClusterGrant.objects.create(team=w.team, cluster=cluster)
    return GpuPrice.objects.create(
        cluster=cluster, per_gpu_hour=Decimal("7.77"), valid_from=timezone.now()
    )


def prices_outsider(w: World) -> None:
    vision_only_price(w)
    response = send(w.api(w.bob), "GET", "/api/v1/prices")
    assert response.status_code == 200, response.content
    assert "vision-only" not in body(response) and "7.77" not in body(response)


def prices_viewer(w: World) -> None:
    vision_only_price(w)
    shows(send(w.api(w.vic), "GET", "/api/v1/prices"), "vision-only", "7.77")


def price_add(user_of: Callable[[World], User]) -> Callable[[World], None]:
    """Adding a price is staff's: a team admin of another team and a viewer get 403."""

    def probe(w: World) -> None:
        data = {"cluster": "local", "per_gpu_hour": "1.00", "valid_from": "2999-01-01T00:00:00Z"}
        response = send(w.api(user_of(w)), "POST", "/api/v1/prices", data)
        assert response.status_code == 403, response.content
        assert not GpuPrice.objects.exists()
        untouched(w)

    return probe


JOB = "/api/v1/jobs/{job_id}"
TEAM = "/api/v1/teams/{name}"
NOT_LEDGER = "no ledger data: the same page for everyone"


def audit_reader(reader: Callable[[World], User], outsider: bool) -> Probe:
    """Bob (another team's admin) and vic (vision's viewer) read none of vision's audit rows:
    the list and CSV hold none of them, the row and the team filter are a 404."""

    def check(w: World) -> None:
        from jobs import audit

        row = audit.record(w.job.user, "job.retry", w.job, {"status": "FAILED"}, None)
        api_client, console = w.api(reader(w)), w.console(reader(w))
        for answer in (api_client.get("/api/v1/audit"), api_client.get("/api/v1/audit.csv")):
            absent(answer, w, team_too=outsider)
            assert "job.retry" not in body(answer)
        hidden(api_client.get(f"/api/v1/audit/{row.pk}"), w)
        hidden(api_client.get("/api/v1/audit", {"team": "vision"}), w)
        absent(console.get("/audit/"), w, team_too=outsider)
        assert "job.retry" not in body(console.get("/audit/"))
        hidden(console.get("/audit/", {"team": "vision"}), w)

    return check


AUDIT = Check(audit_reader(lambda w: w.bob, True), audit_reader(lambda w: w.vic, False))

RUNNER = (
    "the runner's door: a signed job token names one job and attempt, and a user's token or "
    "session is not accepted"
)

ROUTES: dict[str, Check | Exempt] = {
    # The console.
    "* /": Check(console_list_outsider, lambda w: shows(w.console(w.vic).get("/"), SECRET_NAME)),
    "* /jobs/<int:job_id>/": Check(
        lambda w: hidden(w.console(w.bob).get(f"/jobs/{w.job.pk}/"), w), console_job_viewer
    ),
    "* /jobs/<int:job_id>/<str:verb>/": Check(console_verbs_outsider, console_verbs_viewer),
    "* /states/": Exempt(NOT_LEDGER),
    "* /usage/": Check(usage_page_outsider, usage_page_viewer),
    "* /audit/": AUDIT,
    "* /metrics": Check(metrics_endpoint_outsider),
    "* /teams/": Check(
        lambda w: absent(w.console(w.bob).get("/teams/"), w),
        lambda w: shows(w.console(w.vic).get("/teams/"), "vision", "viewer"),
    ),
    "* /teams/<slug:name>/": Check(
        lambda w: hidden(w.console(w.bob).get("/teams/vision/"), w),
        lambda w: shows(w.console(w.vic).get("/teams/vision/"), "alice", "Quotas"),
    ),
    "* /teams/<slug:name>/members/": console_control(
        "/teams/{name}/members/", {"username": "bob", "role": "admin"}
    ),
    "* /teams/<slug:name>/members/<str:username>/role/": console_control(
        "/teams/{name}/members/{username}/role/", {"role": "viewer"}
    ),
    "* /teams/<slug:name>/members/<str:username>/remove/": console_control(
        "/teams/{name}/members/{username}/remove/"
    ),
    "* /teams/<slug:name>/defaults/": console_control(
        "/teams/{name}/defaults/",
        {"default_cluster": "", "window": "", "default_max_retries": "9"},
    ),
    "* /tokens/": Check(lambda w: absent(w.console(w.bob).get("/tokens/"), w)),
    "* /tokens/<int:token_id>/revoke/": Check(token_revoke_outsider),
    "* /arrays/<int:array_id>/": Check(array_page, array_page_viewer),
    "* /arrays/<int:array_id>/<str:verb>/": Check(array_page_verbs),
    "* /compare/": Check(compare_page, compare_page_viewer),
    "* /notifications/": Check(notifications_outsider, notifications_viewer),
    "* /notifications/add/": Check(notification_add_outsider, notification_add_viewer),
    "* /notifications/<int:webhook_id>/test/": notification_control("test"),
    "* /notifications/<int:webhook_id>/remove/": notification_control("remove"),
    "* /static/…": Exempt("the console's own assets (CSS, scripts, Plotly): " + NOT_LEDGER),
    "* /accounts/…": Exempt("Django's sign-in, sign-out and password pages: " + NOT_LEDGER),
    "* /admin/…": Exempt("the Django admin: staff only, checked by the admin site"),
    "* /scim/v2/…": Exempt(
        "SCIM answers the provisioning token (SF_SCIM_TOKEN) only, never a member's token or "
        "session (tests/hostile/test_scim_access.py), and never shows jobs"
    ),
    "* /oidc/…": Exempt("the OpenID sign-in's redirect and callback: " + NOT_LEDGER),
    "* /api/": Exempt("the API's index: " + NOT_LEDGER),
    "* /api/docs": Exempt("the API's documentation: " + NOT_LEDGER),
    "* /api/openapi.json": Exempt("the API's schema: " + NOT_LEDGER),
    # The API.
    "GET /api/v1/me": Check(
        lambda w: absent(w.api(w.bob).get("/api/v1/me"), w),
        lambda w: shows(w.api(w.vic).get("/api/v1/me"), '"vision"', '"viewer"'),
    ),
    "POST /api/v1/snapshots": Exempt(
        "uploads the caller's own bytes and answers their sha256; jobs of other teams are "
        "reached only through the job endpoints"
    ),
    "GET /api/v1/jobs": Check(
        job_list_outsider, lambda w: shows(w.api(w.vic).get("/api/v1/jobs"), SECRET_NAME)
    ),
    "POST /api/v1/jobs": Check(submit_outsider, submit_viewer),
    "GET /api/v1/jobs/{job_id}": api_read("GET", JOB, None, SECRET_NAME),
    "DELETE /api/v1/jobs/{job_id}": api_control("DELETE", JOB),
    "GET /api/v1/jobs/{job_id}/events": api_read("GET", JOB + "/events", None, "alice's note"),
    "GET /api/v1/jobs/{job_id}/diagnostics": api_read("GET", JOB + "/diagnostics", None, "RUNNING"),
    "GET /api/v1/jobs/{job_id}/attempts": api_read("GET", JOB + "/attempts", None, "sf-run"),
    "POST /api/v1/jobs/{job_id}/stop": api_control("POST", JOB + "/stop"),
    "POST /api/v1/jobs/{job_id}/pause": api_control("POST", JOB + "/pause"),
    "POST /api/v1/jobs/{job_id}/resume": api_control("POST", JOB + "/resume"),
    "POST /api/v1/jobs/{job_id}/retry": api_control("POST", JOB + "/retry"),
    "GET /api/v1/jobs/{job_id}/logs": api_read("GET", JOB + "/logs", {"tail": 0}, SECRET_LINE),
    "GET /api/v1/jobs/{job_id}/logs/download": api_read(
        "GET", JOB + "/logs/download", None, SECRET_LINE
    ),
    "GET /api/v1/jobs/{job_id}/metrics": api_read("GET", JOB + "/metrics", None, SECRET_METRIC),
    "POST /api/v1/ingest/logs": Exempt(RUNNER),
    "POST /api/v1/ingest/started": Exempt(RUNNER),
    "POST /api/v1/ingest/checkpoint": Exempt(RUNNER),
    "GET /api/v1/ingest/snapshot": Exempt(RUNNER),
    "POST /api/v1/ingest/metrics": Exempt(RUNNER),
    "POST /api/v1/ingest/token": Exempt(RUNNER),
    "POST /api/v1/ingest/activity": Exempt(RUNNER),
    "POST /api/v1/ingest/dumps": Exempt(RUNNER),
    "GET /api/v1/teams/{name}/activity-policy": api_read(
        "GET", TEAM + "/activity-policy", None, '"idle_grace_s"'
    ),
    "PATCH /api/v1/teams/{name}/activity-policy": api_control(
        "PATCH", TEAM + "/activity-policy", {"idle_after_s": 60}
    ),
    "POST /api/v1/jobs/{job_id}/idle-exemption": api_control(
        "POST", JOB + "/idle-exemption", {"reason": "a notebook"}
    ),
    "DELETE /api/v1/jobs/{job_id}/idle-exemption": api_control("DELETE", JOB + "/idle-exemption"),
    "GET /api/v1/arrays": Check(arrays_listed),
    "POST /api/v1/arrays": Check(array_submit_refused),
    "GET /api/v1/arrays/{array_id}": Check(array_read, array_read_viewer),
    "POST /api/v1/arrays/{array_id}/{verb}": Check(array_verbs),
    "GET /api/v1/webhooks": Check(webhooks_listed),
    "POST /api/v1/webhooks": Check(webhook_add_refused),
    "GET /api/v1/webhooks/{webhook_id}": webhook_api_control("GET"),
    "DELETE /api/v1/webhooks/{webhook_id}": webhook_api_control("DELETE"),
    "POST /api/v1/webhooks/{webhook_id}/test": webhook_api_control("POST", "/test"),
    "GET /api/v1/tokens": Check(lambda w: absent(w.api(w.bob).get("/api/v1/tokens"), w)),
    "POST /api/v1/tokens": Check(token_create_outsider),
    "DELETE /api/v1/tokens/{token_id}": Check(token_revoke_outsider),
    "GET /api/v1/teams": Check(
        lambda w: absent(w.api(w.bob).get("/api/v1/teams"), w),
        lambda w: shows(w.api(w.vic).get("/api/v1/teams"), '"vision"', '"alice"'),
    ),
    "GET /api/v1/teams/{name}": api_read("GET", TEAM, None, '"alice"', '"gpu_quota"'),
    "PATCH /api/v1/teams/{name}": api_control("PATCH", TEAM, {"default_max_retries": 9}),
    # For team admins only: 404 for bob, 403 for vic, as a write.
    "GET /api/v1/teams/{name}/inherited-jobs": api_control("GET", TEAM + "/inherited-jobs"),
    "POST /api/v1/teams/{name}/members": api_control(
        "POST", TEAM + "/members", {"username": "bob", "role": "admin"}
    ),
    "PATCH /api/v1/teams/{name}/members/{username}": api_control(
        "PATCH", TEAM + "/members/{username}", {"role": "viewer"}
    ),
    "DELETE /api/v1/teams/{name}/members/{username}": api_control(
        "DELETE", TEAM + "/members/{username}"
    ),
    "POST /api/v1/teams/{name}/clusters": api_control(
        "POST", TEAM + "/clusters", {"cluster": "local"}
    ),
    "DELETE /api/v1/teams/{name}/clusters/{cluster}": api_control(
        "DELETE", TEAM + "/clusters/{cluster}"
    ),
    "GET /api/v1/usage": Check(usage_api_outsider, usage_api_viewer),
    "GET /api/v1/usage/export": Check(export_outsider, export_viewer),
    "* /mlflow/(?P<path>.*)": Check(mlflow_run_outsider, mlflow_run_viewer),
    "GET /api/v1/prices": Check(prices_outsider, prices_viewer),
    "POST /api/v1/prices": Check(price_add(lambda w: w.bob), price_add(lambda w: w.vic)),
    "PUT /api/v1/teams/{name}/budget": api_control(
        "PUT", TEAM + "/budget", {"money_budget_per_month": "1"}
    ),
    "GET /api/v1/audit": AUDIT,
    "GET /api/v1/audit.csv": AUDIT,
    "GET /api/v1/audit/{entry_id}": AUDIT,
    # The websockets.
    "WS /ws/jobs/": Check(socket_outsider=list_socket_outsider, socket_viewer=list_socket_viewer),
    "WS /ws/jobs/<int:job_id>/": Check(
        socket_outsider=job_socket_outsider, socket_viewer=job_socket_viewer
    ),
}


# -- the routes the project serves ---------------------------------------------------------------

# One entry each for what they hold.
COLLAPSED = ("/admin/", "/accounts/", "/static/", "/scim/v2/", "/oidc/")


def served_routes() -> set[str]:
    """Every route: console patterns (any method), API operations, websocket paths."""
    routes = {f"* {route}" for route in _console_routes()}
    for prefix, router in ninja_api._routers:
        for path, path_view in router.path_operations.items():
            for operation in path_view.operations:
                for method in operation.methods:
                    routes.add(f"{method} /api{prefix}{path}")
    routes |= {f"WS /{pattern.pattern}" for pattern in websocket_urlpatterns}
    return routes


def _console_routes(resolver: URLResolver | None = None, prefix: str = "/") -> set[str]:
    routes = set()
    for pattern in (resolver or get_resolver()).url_patterns:
        route = prefix + str(pattern.pattern).lstrip("^").rstrip("$")
        collapsed = next((c for c in COLLAPSED if route.startswith(c)), None)
        if collapsed:
            routes.add(collapsed + "…")
        elif isinstance(pattern, URLResolver):
            routes |= _console_routes(pattern, route)
        elif isinstance(pattern, URLPattern) and pattern.callback.__module__ != "ninja.operation":
            routes.add(route)  # API operations come from the routers, with their methods
    return routes


def test_every_route_has_an_entry_and_every_entry_a_route():
    served = served_routes()
    assert sorted(served - ROUTES.keys()) == [], "new routes: add them to ROUTES with a check"
    assert sorted(ROUTES.keys() - served) == [], "stale entries: these routes are gone"


def test_every_exemption_says_why_and_every_check_probes_someone():
    for key, entry in ROUTES.items():
        if isinstance(entry, Exempt):
            assert len(entry.reason) > 20, key
        else:
            assert entry.outsider or entry.socket_outsider, key


def _keys(kind: str) -> list[str]:
    return sorted(k for k, e in ROUTES.items() if isinstance(e, Check) and getattr(e, kind))


@pytest.mark.django_db
@pytest.mark.parametrize("key", _keys("outsider"))
def test_another_team_cannot_see_stream_control_or_meter_alices_job(key, world):
    ROUTES[key].outsider(world)  # type: ignore[union-attr,misc]


@pytest.mark.django_db
@pytest.mark.parametrize("key", _keys("viewer"))
def test_a_viewer_reads_alices_job_but_controls_nothing(key, world):
    ROUTES[key].viewer(world)  # type: ignore[union-attr,misc]


@pytest.fixture
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("key", _keys("socket_outsider"))
def test_another_team_cannot_stream_alices_job(key, world, in_memory_layer):
    async_to_sync(ROUTES[key].socket_outsider)(world)  # type: ignore[union-attr,misc]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("key", _keys("socket_viewer"))
def test_a_viewer_streams_alices_job(key, world, in_memory_layer):
    async_to_sync(ROUTES[key].socket_viewer)(world)  # type: ignore[union-attr,misc]


# -- leaving a team closes what was open ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_removed_member_stops_streaming_the_team_at_once(world, in_memory_layer):
    ada = User.objects.get(username="ada")
    admin = world.api(ada)

    async def scenario() -> None:
        session = await _session(world.vic)
        page, listing = socket(f"/ws/jobs/{world.job.pk}/", session), socket("/ws/jobs/", session)
        for communicator in (page, listing):
            assert (await communicator.connect())[0]
        removed = await database_sync_to_async(admin.delete)("/api/v1/teams/vision/members/vic")
        assert removed.status_code == 204
        assert (await page.receive_output())["code"] == 4404
        await _stop_alices_job(world)
        assert await listing.receive_nothing(timeout=0.3)
        await listing.disconnect()

    async_to_sync(scenario)()
