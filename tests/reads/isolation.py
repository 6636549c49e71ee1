"""The machinery of tests/reads/test_isolation.py: the world it probes (team vision: alice, a
member with a running job, its logs, metrics and token; vic, a viewer; team nlp: bob), what an
answer may hold (no secret of alice's), and the kinds of check a route gets (`Check`, `Exempt`,
`api_read`, `api_control`, `console_control`)."""

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.test import Client

from jobs.actions.tokens import create_token
from jobs.models import ApiToken, Job, JobEvent, Membership, Team
from jobs.states import JobStatus

SECRET_NAME = "alice-secret-run"
SECRET_LINE = "alice secret line"
SECRET_METRIC = "alice_secret_metric"
SECRET_TOKEN = "alice-laptop"
VERBS = ("stop", "pause", "resume", "retry")


@dataclass
class World:
    team: Team
    job: Job  # alice's, RUNNING for an hour, with an attempt, logs, metrics and events
    token: ApiToken  # alice's
    bob: User
    vic: User

    def api(self, user: User) -> Client:
        return Client(HTTP_AUTHORIZATION=f"Bearer {create_token(user, 'test')[1]}")

    def console(self, user: User) -> Client:
        client = Client()
        client.force_login(user)
        return client

    def path(self, template: str) -> str:
        return template.format(
            job_id=self.job.pk,
            name=self.team.name,
            username="alice",
            cluster="local",
            token_id=self.token.pk,
            verb="{verb}",
        )


# -- what an answer may hold ---------------------------------------------------------------------


def body(response) -> str:
    if not response.streaming:
        return response.content.decode()
    if response.is_async:

        async def collect() -> bytes:
            return b"".join([chunk async for chunk in response.streaming_content])

        return async_to_sync(collect)().decode()
    return b"".join(response.streaming_content).decode()


def leaks(text: str, w: World) -> list[str]:
    """The pieces of alice's job found in an answer meant for someone outside her team."""
    secrets = (SECRET_NAME, SECRET_LINE, SECRET_METRIC, SECRET_TOKEN, w.job.run_id)
    return [secret for secret in secrets if secret in text]


def hidden(response, w: World, status: int = 404) -> None:
    assert response.status_code == status, body(response)[:500]
    assert not leaks(body(response), w)


def absent(response, w: World, team_too: bool = True) -> None:
    """A list answered (200) without a trace of alice's job (nor her team, with `team_too`)."""
    assert response.status_code == 200, body(response)[:500]
    text = body(response)
    assert not leaks(text, w)
    if team_too:
        assert "vision" not in text and "alice" not in text


def shows(response, *fragments: str) -> None:
    assert response.status_code == 200, body(response)[:500]
    text = body(response)
    for fragment in fragments:
        assert fragment in text


def untouched(w: World) -> None:
    """Alice's job, team and token are as the world made them."""
    job = Job.objects.get(pk=w.job.pk)
    assert job.status == JobStatus.RUNNING and job.retry_count == 0
    assert not JobEvent.objects.filter(job=job, actor__in=["bob", "vic"]).exists()
    roles = dict(Membership.objects.filter(team=w.team).values_list("user__username", "role"))
    assert roles == {"alice": "member", "ada": "admin", "vic": "viewer"}
    team = Team.objects.get(pk=w.team.pk)
    assert (team.default_max_retries, team.default_cluster_id) == (0, w.team.default_cluster_id)
    assert team.money_budget_per_month is None
    assert ApiToken.objects.get(pk=w.token.pk).revoked_at is None


def send(client: Client, method: str, path: str, data: dict | None = None, **extra):
    """An API call with a JSON body (GET: query parameters)."""
    if method == "GET":
        return client.get(path, data or {}, **extra)
    payload = json.dumps(data or {})
    return getattr(client, method.lower())(path, payload, content_type="application/json", **extra)


# -- entry kinds ---------------------------------------------------------------------------------

Probe = Callable[[World], None]
SocketProbe = Callable[[World], Awaitable[None]]


@dataclass(frozen=True)
class Check:
    outsider: Probe | None = None  # bob, of team nlp
    viewer: Probe | None = None  # vic, a viewer in alice's team vision
    socket_outsider: SocketProbe | None = None
    socket_viewer: SocketProbe | None = None


@dataclass(frozen=True)
class Exempt:
    reason: str


def api_read(method: str, template: str, data: dict | None = None, *expect: str) -> Check:
    """An API read of alice's job or team: 404 for bob; vic reads it."""

    def outsider(w: World) -> None:
        hidden(send(w.api(w.bob), method, w.path(template), data), w)

    def viewer(w: World) -> None:
        shows(send(w.api(w.vic), method, w.path(template), data), *expect)

    return Check(outsider, viewer)


def api_control(method: str, template: str, data: dict | None = None) -> Check:
    """An API write on alice's job or team: 404 for bob, 403 for vic, and nothing changes."""

    def outsider(w: World) -> None:
        hidden(send(w.api(w.bob), method, w.path(template), data), w)
        untouched(w)

    def viewer(w: World) -> None:
        response = send(w.api(w.vic), method, w.path(template), data)
        assert response.status_code == 403, response.content
        untouched(w)

    return Check(outsider, viewer)


def console_control(template: str, form: dict | None = None) -> Check:
    """A console form posting to alice's team: 404 for bob, 403 for vic, nothing changes."""

    def outsider(w: World) -> None:
        hidden(w.console(w.bob).post(w.path(template), form or {}), w)
        untouched(w)

    def viewer(w: World) -> None:
        assert w.console(w.vic).post(w.path(template), form or {}).status_code == 403
        untouched(w)

    return Check(outsider, viewer)
