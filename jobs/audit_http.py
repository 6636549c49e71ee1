"""The HTTP door of the audit log: every request that changes something through the API (and
so the CLI) or the console is recorded here, once, by `AuditTrail`, a middleware.

Why at the door and not in each action: a route added tomorrow is recorded without anyone
remembering to, the action's name and target come from one table (`ROUTES`) that
tests/audit/test_audit_completeness.py holds to the URL conf, and the settings a change touched
are read before and after it the same way for every route (`jobs.audit.state_of`). A request is
recorded when a person made it (a console session or a user's API token: a job's token is the
job's, not a person's), it succeeded (an answer below 400, and for the console no error message
queued), and nothing during it called `jobs.audit.record` itself (SCIM, OpenID, sign-in).

The target is found before the view runs (a deleted job still names its team), and a created
thing from the answer (its `id`) or, for the console's token form, the newest token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import messages
from django.http import HttpRequest, HttpResponse

from jobs import audit
from jobs.audit import Target
from jobs.schemas import text_fault

log = logging.getLogger(__name__)
SCIM_PREFIX = "/scim/v2/"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Paths no person changes anything through, with why (tests/audit/test_audit_completeness.py):
NOT_A_PERSONS = (
    "/api/v1/ingest/",  # the runner's reports, by a job's token: the job's, not a person's
    "/mlflow/",  # a job's tracking token adds to its own attempt; a user's token only reads
    "/admin/",  # the admin's own log is recorded (jobs.audit_signals), with its before/after
    "/accounts/login/",  # user_logged_in / user_login_failed (jobs.audit_signals)
    "/accounts/logout/",  # user_logged_out (jobs.audit_signals)
)


# The hot paths of jobs' own reports are not even marked as served (the admin's and sign-in's
# are: their signals read the request being served).
NOT_SERVED = NOT_A_PERSONS[:2]


@dataclass(frozen=True)
class Route:
    action: str
    kind: str  # what the target is: job, array, team, member, grant, token, webhook, price, ...
    created: bool = False  # the target is made by the request: found in the answer


# (method, the URL conf's route) -> what the row says. A mutating route missing here is
# recorded as "<method> <route>" and fails the completeness test until it is named.
ROUTES: dict[tuple[str, str], Route] = {
    ("POST", "api/v1/snapshots"): Route("snapshot.upload", "snapshot", created=True),
    ("POST", "api/v1/jobs"): Route("job.submit", "job", created=True),
    ("DELETE", "api/v1/jobs/<job_id>"): Route("job.delete", "job"),
    ("POST", "api/v1/jobs/<job_id>/stop"): Route("job.stop", "job"),
    ("POST", "api/v1/jobs/<job_id>/pause"): Route("job.pause", "job"),
    ("POST", "api/v1/jobs/<job_id>/resume"): Route("job.resume", "job"),
    ("POST", "api/v1/jobs/<job_id>/retry"): Route("job.retry", "job"),
    ("POST", "api/v1/jobs/<job_id>/idle-exemption"): Route("job.idle_exempt", "job"),
    ("DELETE", "api/v1/jobs/<job_id>/idle-exemption"): Route("job.idle_exemption_lift", "job"),
    ("POST", "api/v1/tokens"): Route("token.create", "token", created=True),
    ("DELETE", "api/v1/tokens/<token_id>"): Route("token.revoke", "token"),
    ("PATCH", "api/v1/teams/<name>"): Route("team.defaults", "team"),
    ("POST", "api/v1/teams/<name>/members"): Route("team.member_add", "member", created=True),
    ("PATCH", "api/v1/teams/<name>/members/<username>"): Route("team.member_role", "member"),
    ("DELETE", "api/v1/teams/<name>/members/<username>"): Route("team.member_remove", "member"),
    ("POST", "api/v1/teams/<name>/clusters"): Route("team.cluster_grant", "team"),
    ("DELETE", "api/v1/teams/<name>/clusters/<cluster>"): Route("team.cluster_revoke", "team"),
    ("PATCH", "api/v1/teams/<name>/activity-policy"): Route("team.activity_policy", "team"),
    ("PUT", "api/v1/teams/<name>/budget"): Route("team.budget", "team"),
    ("POST", "api/v1/prices"): Route("price.add", "gpuprice", created=True),
    ("POST", "api/v1/webhooks"): Route("webhook.add", "webhook", created=True),
    ("DELETE", "api/v1/webhooks/<webhook_id>"): Route("webhook.remove", "webhook"),
    ("POST", "api/v1/webhooks/<webhook_id>/test"): Route("webhook.test", "webhook"),
    ("POST", "api/v1/arrays"): Route("array.submit", "array", created=True),
    ("POST", "api/v1/arrays/<array_id>/<verb>"): Route("array.{verb}", "array"),
    ("POST", "jobs/<int:job_id>/<str:verb>/"): Route("job.{verb}", "job"),
    ("POST", "arrays/<int:array_id>/<str:verb>/"): Route("array.{verb}", "array"),
    ("POST", "teams/<slug:name>/members/"): Route("team.member_add", "member", created=True),
    ("POST", "teams/<slug:name>/members/<str:username>/role/"): Route("team.member_role", "member"),
    ("POST", "teams/<slug:name>/members/<str:username>/remove/"): Route(
        "team.member_remove", "member"
    ),
    ("POST", "teams/<slug:name>/defaults/"): Route("team.defaults", "team"),
    ("POST", "tokens/"): Route("token.create", "token", created=True),
    ("POST", "tokens/<int:token_id>/revoke/"): Route("token.revoke", "token"),
    ("POST", "notifications/add/"): Route("webhook.add", "webhook", created=True),
    ("POST", "notifications/<int:webhook_id>/test/"): Route("webhook.test", "webhook"),
    ("POST", "notifications/<int:webhook_id>/remove/"): Route("webhook.remove", "webhook"),
    ("POST", "accounts/password_change/"): Route("user.password_change", "user"),
}


class AuditTrail:
    """The middleware: marks the request being served (`jobs.audit.serving`), reads the target
    and its settings before the view, and records the change after a successful answer."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in MUTATING or request.path.startswith(NOT_SERVED):
            return self.get_response(request)
        mark = audit.serving(request)
        try:
            response = self.get_response(request)
            try:
                _after(request, response)
            except Exception:  # the change is committed: its answer stands, the loss is logged
                log.exception("no audit row for %s %s", request.method, request.path)
        finally:
            audit.done(mark)
        return response

    def process_view(self, request, view_func, view_args, view_kwargs) -> None:
        call = audit.current()
        if call is None or call.request is not request or _exempt(request.path):
            return None
        match = request.resolver_match
        route = ROUTES.get((request.method or "", match.route)) if match else None
        call.extra["route"] = route
        call.extra["kwargs"] = dict(view_kwargs)
        call.extra["since"] = audit.now()
        if route is not None and not route.created:
            found = _existing(route.kind, view_kwargs, request)
            call.extra["target"] = found
            call.extra["before"] = audit.state_of_target(found)
        return None


def _exempt(path: str) -> bool:
    return any(path.startswith(prefix) for prefix in NOT_A_PERSONS)


def _after(request: HttpRequest, response: HttpResponse) -> None:
    call = audit.current()
    if call is None or call.recorded or _exempt(request.path) or "kwargs" not in call.extra:
        return
    if response.status_code >= 400 or _refused_on_page(request):
        return
    person = _person(request)
    if person is None:
        if request.path.startswith(SCIM_PREFIX):  # the IdP's client, by its provisioning token
            _record_scim(request, call.extra["kwargs"])
        return
    route: Route | None = call.extra.get("route")
    kwargs = call.extra["kwargs"]
    if route is None:
        match = request.resolver_match
        audit.record(person, f"{request.method} {match.route if match else request.path}", "")
        return
    target = call.extra.get("target")
    if route.kind == "user":
        target = audit.as_target(person)
    elif route.created:
        target = _created(route.kind, request, response, kwargs, call.extra["since"])
    before = call.extra.get("before")
    after = audit.state_of_target(target)
    if route.created or after is None:
        shown_before, shown_after = before, after
    else:
        shown_before, shown_after = audit.changed(before, after)
    action = route.action.format(verb=kwargs.get("verb", ""))
    audit.record(person, action, target, before=shown_before, after=shown_after)


def _record_scim(request: HttpRequest, kwargs: dict) -> None:
    """A SCIM change that recorded nothing itself: who is the provisioning client."""
    resource = request.path.removeprefix(SCIM_PREFIX).split("/", 1)[0] or "scim"
    key = next((str(v) for v in kwargs.values()), "")
    target = Target(resource.lower().rstrip("s")[:32], key, request.path[:200])
    audit.record("scim", f"scim.{resource.lower()}.{(request.method or '').lower()}", target)


def _person(request: HttpRequest):
    """The person who made the request: a user's token's (ninja's `request.auth`) or the
    console session's; None for a job's credentials or nobody."""
    auth = getattr(request, "auth", None)
    if auth is not None:
        return auth if getattr(auth, "is_authenticated", False) else None
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated else None


def _refused_on_page(request: HttpRequest) -> bool:
    """Whether a console form answered a refusal as a message on its page."""
    queued = getattr(getattr(request, "_messages", None), "_queued_messages", [])
    return any(m.level >= messages.ERROR for m in queued)


def _existing(kind: str, kwargs: dict, request: HttpRequest) -> Target | None:
    """The target the route names, unless an argument is text the ledger cannot hold (the view
    answers its 4xx; nothing is changed, so nothing is recorded)."""
    if any(isinstance(v, str) and text_fault(v) for v in kwargs.values()):
        return None
    return audit.find_target(kind, kwargs)


def _created(
    kind: str, request: HttpRequest, response: HttpResponse, kwargs: dict, since
) -> Target | None:
    body = _json(response)
    if kind == "snapshot":
        return audit.snapshot_target(body.get("sha256", ""), request)
    if kind == "member":
        username = body.get("username") or request.POST.get("username", "")
        return audit.find_target("member", {**kwargs, "username": username})
    if "id" in body:
        return audit.find_target(kind, {f"{kind}_id": body["id"]})
    # A console form answers a page, and a price no id: the newest row made during the request.
    return audit.newest_made(kind, _person(request), since)


def _json(response: HttpResponse) -> dict:
    if not response.get("Content-Type", "").startswith("application/json"):
        return {}
    try:
        body = json.loads(response.content)
    except (ValueError, AttributeError):
        return {}
    return body if isinstance(body, dict) else {}
