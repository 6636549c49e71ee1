"""The audit log is complete: every mutating route of the URL conf (django-ninja's operations
with POST, PUT, PATCH or DELETE, and every console view, which may take a POST) and every model
the Django admin can change is driven through one valid change here, and each must write its
audit row naming the person. A route or admin model added without a scenario fails the walk;
the only routes without one are in EXEMPT, each with why."""

import datetime as dt

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from jobs.audit_http import ROUTES
from jobs.audited import AuditEntry
from jobs.models import ApiToken, Job, JobArray, Membership, Webhook
from starforge.api import api
from tests.admin_forms import change_form
from tests.api_helpers import upload_snapshot
from tests.factories import place, queued_job

pytestmark = pytest.mark.django_db

MUTATING = ("POST", "PUT", "PATCH", "DELETE")
# Routes no person changes anything through here, with why.
EXEMPT = {
    **{
        ("POST", f"api/v1/ingest/{name}"): "the runner's reports, by a job's token: the job's"
        for name in ("logs", "started", "checkpoint", "token", "activity", "dumps", "metrics")
    },
    ("POST", "^mlflow/(?P<path>.*)$"): "a job's tracking token adds to its own attempt only; "
    "a user's token reads (MLflow's searches are POSTs): tests/hostile/test_mlflow_tokens.py",
    ("POST", "accounts/login/"): "recorded by user_logged_in / user_login_failed: test_doors",
    ("POST", "accounts/logout/"): "recorded by user_logged_out: test_audit_doors",
    ("POST", "accounts/password_reset/"): "sends an email, changes nothing",
    ("POST", "accounts/reset/<uidb64>/<token>/"): "a signed-out person's new password: "
    "no actor but the link; Django's own view",
    ("POST", "^static/(?P<path>.*)$"): "files; GET only",
}
# Route prefixes recorded another way, with why.
EXEMPT_PREFIXES = {
    "oidc/": "OpenID sign-in, its failures and sign-out go through django.contrib.auth, whose "
    "signals are recorded (jobs.audit_signals; test_audit_doors)",
    "scim/v2/": "SCIM's changes are recorded by jobs.scim through jobs.audit.record, and by "
    "the door (jobs.audit_http: a successful SCIM change nothing recorded, as the "
    "provisioning client); its scenarios belong with SCIM's tests (issue 51, point 2)",
}
# Console pages that only read (a POST there is a read or a 405).
READS = {
    "",
    "jobs/<int:job_id>/",
    "arrays/<int:array_id>/",
    "compare/",
    "states/",
    "usage/",
    "metrics",
    "teams/",
    "teams/<slug:name>/",
    "notifications/",
    "audit/",
    "accounts/password_change/done/",
    "accounts/password_reset/done/",
    "accounts/reset/done/",
}


def mutating_routes() -> set[tuple[str, str]]:
    found = set()
    for path, methods in api.get_openapi_schema()["paths"].items():
        route = path.lstrip("/").replace("{", "<").replace("}", ">")
        found |= {(m.upper(), route) for m in methods if m.upper() in MUTATING}
    for route in _console_routes(get_resolver().url_patterns, ""):
        if route not in READS and not route.startswith(tuple(EXEMPT_PREFIXES)):
            found.add(("POST", route))
    return found


def _console_routes(patterns, prefix: str):
    for p in patterns:
        text = prefix + str(p.pattern)
        if text.startswith(("api/", "admin/")):
            continue
        if isinstance(p, URLResolver):
            yield from _console_routes(p.url_patterns, text)
        elif isinstance(p, URLPattern):
            yield text


@pytest.fixture
def world(make_user, local_cluster, team, api_as, settings):
    settings.SF_NOTIFY_EMAIL = True  # webhooks to mailto: addresses
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    root = User.objects.create_superuser("root", password="pw")
    Membership.objects.create(team=team, user=root, role="admin")
    make_user("bob", team)
    make_user("carol")
    console = Client()
    console.force_login(root)
    return {"root": root, "api": api_as(root), "console": console, "team": team}


def _job(w, status: str = "QUEUED") -> int:
    job = queued_job(w["team"], w["root"])
    return place(job, status).pk if status != "QUEUED" else job.pk


def _array(w) -> int:
    response = w["api"].post("/arrays", {"entrypoint": ["true"], "array": "0-1"})
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _token(w) -> int:
    return w["api"].post("/tokens", {"name": "x"}).json()["id"]


def _hook(w) -> int:
    body = {"url": "mailto:ops@example.com", "on": ["failed"]}
    return w["api"].post("/webhooks", body).json()["id"]


def _send(w, method: str, path: str, body=None):
    client = w["api"].client
    call = getattr(client, method.lower())
    return call(f"/api/v1{path}", body or {}, content_type="application/json")


def _form(w, path: str, data=None):
    return w["console"].post(path, data or {})


DEFAULTS_FORM = {
    "default_cluster": "local",
    "default_max_retries": "2",
    "default_retry_cooldown_s": "60",
    "default_time_limit_s": "",
}
# (method, route) -> (the change, done through the route; the action its row must name)
SCENARIOS = {
    ("POST", "api/v1/snapshots"): (lambda w: _upload(w), "snapshot.upload"),
    ("POST", "api/v1/jobs"): (
        lambda w: _send(w, "POST", "/jobs", {"entrypoint": ["true"]}),
        "job.submit",
    ),
    ("DELETE", "api/v1/jobs/<job_id>"): (
        lambda w: _send(w, "DELETE", f"/jobs/{_job(w, 'STOPPED')}"),
        "job.delete",
    ),
    **{
        ("POST", f"api/v1/jobs/<job_id>/{verb}"): (
            lambda w, verb=verb, state=state: _send(w, "POST", f"/jobs/{_job(w, state)}/{verb}"),
            f"job.{verb}",
        )
        for verb, state in (
            ("stop", "QUEUED"),
            ("pause", "QUEUED"),
            ("resume", "PAUSED"),
            ("retry", "FAILED"),
        )
    },
    ("POST", "api/v1/jobs/<job_id>/idle-exemption"): (
        lambda w: _send(w, "POST", f"/jobs/{_job(w)}/idle-exemption", {"reason": "eval"}),
        "job.idle_exempt",
    ),
    ("DELETE", "api/v1/jobs/<job_id>/idle-exemption"): (
        lambda w: _lift(w),
        "job.idle_exemption_lift",
    ),
    ("POST", "api/v1/tokens"): (
        lambda w: _send(w, "POST", "/tokens", {"name": "ci"}),
        "token.create",
    ),
    ("DELETE", "api/v1/tokens/<token_id>"): (
        lambda w: _send(w, "DELETE", f"/tokens/{_token(w)}"),
        "token.revoke",
    ),
    ("PATCH", "api/v1/teams/<name>"): (
        lambda w: _send(w, "PATCH", "/teams/vision", {"default_max_retries": 4}),
        "team.defaults",
    ),
    ("POST", "api/v1/teams/<name>/members"): (
        lambda w: _send(w, "POST", "/teams/vision/members", {"username": "carol"}),
        "team.member_add",
    ),
    ("PATCH", "api/v1/teams/<name>/members/<username>"): (
        lambda w: _send(w, "PATCH", "/teams/vision/members/bob", {"role": "viewer"}),
        "team.member_role",
    ),
    ("DELETE", "api/v1/teams/<name>/members/<username>"): (
        lambda w: _send(w, "DELETE", "/teams/vision/members/bob"),
        "team.member_remove",
    ),
    ("POST", "api/v1/teams/<name>/clusters"): (lambda w: _grant(w), "team.cluster_grant"),
    ("DELETE", "api/v1/teams/<name>/clusters/<cluster>"): (
        lambda w: _revoke(w),
        "team.cluster_revoke",
    ),
    ("PATCH", "api/v1/teams/<name>/activity-policy"): (
        lambda w: _send(w, "PATCH", "/teams/vision/activity-policy", {"idle_after_s": 600}),
        "team.activity_policy",
    ),
    ("PUT", "api/v1/teams/<name>/budget"): (
        lambda w: _send(w, "PUT", "/teams/vision/budget", {"money_budget_per_month": "100"}),
        "team.budget",
    ),
    ("POST", "api/v1/prices"): (
        lambda w: _send(w, "POST", "/prices", {"cluster": "local", "per_gpu_hour": "2.5"}),
        "price.add",
    ),
    ("POST", "api/v1/webhooks"): (lambda w: _send_hook(w), "webhook.add"),
    ("DELETE", "api/v1/webhooks/<webhook_id>"): (
        lambda w: _send(w, "DELETE", f"/webhooks/{_hook(w)}"),
        "webhook.remove",
    ),
    ("POST", "api/v1/webhooks/<webhook_id>/test"): (
        lambda w: _send(w, "POST", f"/webhooks/{_hook(w)}/test"),
        "webhook.test",
    ),
    ("POST", "api/v1/arrays"): (
        lambda w: _send(w, "POST", "/arrays", {"entrypoint": ["true"], "array": "0-1"}),
        "array.submit",
    ),
    ("POST", "api/v1/arrays/<array_id>/<verb>"): (
        lambda w: _send(w, "POST", f"/arrays/{_array(w)}/stop"),
        "array.stop",
    ),
    ("POST", "jobs/<int:job_id>/<str:verb>/"): (
        lambda w: _form(w, f"/jobs/{_job(w)}/pause/"),
        "job.pause",
    ),
    ("POST", "arrays/<int:array_id>/<str:verb>/"): (
        lambda w: _form(w, f"/arrays/{_array(w)}/pause/"),
        "array.pause",
    ),
    ("POST", "teams/<slug:name>/members/"): (
        lambda w: _form(w, "/teams/vision/members/", {"username": "carol", "role": "viewer"}),
        "team.member_add",
    ),
    ("POST", "teams/<slug:name>/members/<str:username>/role/"): (
        lambda w: _form(w, "/teams/vision/members/bob/role/", {"role": "admin"}),
        "team.member_role",
    ),
    ("POST", "teams/<slug:name>/members/<str:username>/remove/"): (
        lambda w: _form(w, "/teams/vision/members/bob/remove/"),
        "team.member_remove",
    ),
    ("POST", "teams/<slug:name>/defaults/"): (
        lambda w: _form(w, "/teams/vision/defaults/", DEFAULTS_FORM),
        "team.defaults",
    ),
    ("POST", "tokens/"): (lambda w: _form(w, "/tokens/", {"name": "laptop"}), "token.create"),
    ("POST", "tokens/<int:token_id>/revoke/"): (
        lambda w: _form(w, f"/tokens/{_token(w)}/revoke/"),
        "token.revoke",
    ),
    ("POST", "notifications/add/"): (
        lambda w: _form(w, "/notifications/add/", {"url": "mailto:a@example.com", "on": "failed"}),
        "webhook.add",
    ),
    ("POST", "notifications/<int:webhook_id>/test/"): (
        lambda w: _form(w, f"/notifications/{_hook(w)}/test/"),
        "webhook.test",
    ),
    ("POST", "notifications/<int:webhook_id>/remove/"): (
        lambda w: _form(w, f"/notifications/{_hook(w)}/remove/"),
        "webhook.remove",
    ),
    ("POST", "accounts/password_change/"): (
        lambda w: _form(
            w,
            "/accounts/password_change/",
            {
                "old_password": "pw",
                "new_password1": "Zx9-long-enough!",
                "new_password2": "Zx9-long-enough!",
            },
        ),
        "user.password_change",
    ),
}


def _upload(w):
    class Uploader:
        client = w["api"].client

    upload_snapshot(Uploader)
    return _Done()


class _Done:
    status_code = 201


def _lift(w):
    job = _job(w)
    _send(w, "POST", f"/jobs/{job}/idle-exemption", {"reason": "eval"})
    return _send(w, "DELETE", f"/jobs/{job}/idle-exemption")


def _grant(w):
    from jobs.models import Cluster

    Cluster.objects.create(name="extra", kind="noop", settings={})
    return _send(w, "POST", "/teams/vision/clusters", {"cluster": "extra"})


def _revoke(w):
    _grant(w)
    return _send(w, "DELETE", "/teams/vision/clusters/extra")


def _send_hook(w):
    body = {"url": "mailto:ops@example.com", "on": ["failed"], "team": "vision"}
    return _send(w, "POST", "/webhooks", body)


def test_every_mutating_route_has_a_scenario_or_a_reason():
    routes = mutating_routes()
    assert routes - set(SCENARIOS) - set(EXEMPT) == set()
    assert set(SCENARIOS) - routes == set(), "a scenario for a route that is gone"
    assert {k for k in SCENARIOS if k not in ROUTES} == set(), "jobs.audit_http.ROUTES names each"


@pytest.mark.parametrize("route", sorted(SCENARIOS), ids=lambda r: f"{r[0]} {r[1]}")
def test_each_route_writes_its_row_naming_the_person(world, route):
    change, action = SCENARIOS[route]
    response = change(world)
    assert response.status_code < 400, getattr(response, "content", b"")[:500]
    rows = list(AuditEntry.objects.filter(action=action).order_by("-id"))
    assert rows, f"{route} wrote no {action} row"
    row = rows[0]
    assert (row.actor, row.actor_id) == ("root", world["root"].pk)
    assert row.door in ("api", "console", "sign-in")
    assert row.target or row.target_type == "user", f"{route}: its row names no target"


def admin_models() -> list[type]:
    return sorted(admin.site._registry, key=lambda m: m._meta.label)


def _admin_object(model, w):
    """One row of `model` to change through the admin."""
    makers = {
        "jobs.Team": lambda: w["team"],
        "jobs.Cluster": lambda: w["team"].default_cluster,
        "jobs.ApiToken": lambda: ApiToken.objects.get(pk=_token(w)),
        "jobs.Webhook": lambda: Webhook.objects.get(pk=_hook(w)),
        "jobs.Job": lambda: Job.objects.get(pk=_job(w, "SUCCEEDED")),
        "jobs.JobArray": lambda: JobArray.objects.get(pk=_array(w)),
        "auth.User": lambda: w["root"],
    }
    make = makers.get(model._meta.label)
    return make() if make else None


# Admin models changed some other way than the change form, with why.
ADMIN_OTHER = {
    "jobs.AuditEntry": "read-only for everyone: test_audit_hostile checks it refuses changes",
    "metering.UsageRecord": "read-only for everyone (no add, change or delete)",
}


def test_every_model_the_admin_can_change_writes_a_row(world):
    client = Client()
    client.force_login(world["root"])
    missing = []
    for model in admin_models():
        label = model._meta.label
        if label in ADMIN_OTHER:
            continue
        newest = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
        response = _admin_change(client, model, world)
        assert response.status_code == 302, (label, response.content[:3000])
        rows = AuditEntry.objects.filter(
            id__gt=newest,
            door="admin",
            actor="root",
            action__startswith=f"admin.{model._meta.model_name}.",
        )
        if not rows.exists():
            missing.append(label)
    assert missing == []


def _admin_change(client, model, world):
    meta = model._meta
    base = f"/admin/{meta.app_label}/{meta.model_name}/"
    obj = _admin_object(model, world)
    if obj is None:  # add a row through the add form
        url = f"{base}add/"
    else:
        url = f"{base}{obj.pk}/change/"
    page = client.get(url)
    if page.status_code == 403 and obj is None:
        return _admin_delete_any(client, model, base, world)
    assert page.status_code == 200, (url, page.status_code)
    data = change_form(page.content.decode(), fill=_add_values(meta.label, world))
    data["_save"] = "Save"
    return client.post(url, data)


def _add_values(label: str, world) -> dict:
    return {
        "jobs.ScheduleWindow": {"name": "nights", "spec": "Mon-Sun 00:00-06:00"},
        "jobs.GpuPrice": {
            "cluster": str(world["team"].default_cluster_id),
            "per_gpu_hour": "1.5",
            "valid_from_0": "2999-01-01",
            "valid_from_1": "00:00:00",
        },
        "auth.Group": {"name": "ops"},
    }.get(label, {})


def _admin_delete_any(client, model, base, world):
    if model._meta.label == "jobs.BudgetAlert":  # written by the scheduler: made here
        model.objects.create(
            team=world["team"],
            month=dt.date(2026, 12, 1),
            percent=50,
            used_micros=1,
            budget_micros=2,
        )
    obj = model._default_manager.first()
    assert obj is not None, f"no {model._meta.label} row to delete"
    return client.post(f"{base}{obj.pk}/delete/", {"post": "yes"})
