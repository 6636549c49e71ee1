"""Live transport: the job websocket, publishing after commit, a Logs tab that never shows a gap.

Websocket scenarios run as coroutines (`run`) against the real ASGI application with an
in-memory channel layer of the same capacity as channels_redis's default (100 per channel).
"""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client

from jobs.ledger.transitions import transition
from jobs.states import JobStatus
from jobs.stores import logstore
from starforge.asgi import application
from tests.factories import queued_job
from tests.sockets import close_code, run, session_of, signed_in, socket

FLOOD_LINES = 50_000
FLOOD_BATCH = 100  # 500 messages: five times what one channel holds
TAIL = 2000
PAGE = 10_000


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": 100},
        }
    }


@pytest.fixture
def theirs(make_team, make_user):
    other = make_team("nlp")
    return queued_job(other, make_user("bob", other), name="their-run")


def wire_lines(first: int, count: int) -> list[dict]:
    return [
        {
            "seq": seq,
            "stream": "stderr" if seq % 7 == 0 else "stdout",
            "ts": 1700000000.0 + seq,
            "text": f"line {seq}",
        }
        for seq in range(first, first + count)
    ]


async def streamed(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


@pytest.mark.django_db(transaction=True)
def test_socket_refuses_anonymous_users_and_another_teams_job(team, alice, theirs):
    mine = queued_job(team, alice)
    alice = session_of(alice)

    async def scenario():
        assert await close_code(socket(f"/ws/jobs/{mine.pk}/")) == 4401
        assert await close_code(socket(f"/ws/jobs/{theirs.pk}/", alice)) == 4404
        assert await close_code(socket("/ws/jobs/999999/", alice)) == 4404
        assert await close_code(socket("/ws/jobs/")) == 4401

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_a_status_change_reaches_the_job_page_and_the_list_of_its_team_only(team, alice, theirs):
    job = queued_job(team, alice)
    alice, bob = session_of(alice), session_of(theirs.user)

    async def scenario():
        page, my_list, bobs_list = (
            socket(f"/ws/jobs/{job.pk}/", alice),
            socket("/ws/jobs/", alice),
            socket("/ws/jobs/", bob),
        )
        for communicator in (page, my_list, bobs_list):
            assert (await communicator.connect())[0]
        await database_sync_to_async(transition)(
            job.pk, JobStatus.SUBMITTED, reason="quota reserved", actor="scheduler"
        )
        for communicator in (page, my_list):
            message = await communicator.receive_json_from(timeout=5)
            assert message["type"] == "job.status"
            assert (message["job"], message["from"], message["status"]) == (
                job.pk,
                "QUEUED",
                "SUBMITTED",
            )
            assert message["reason"] == "quota reserved" and message["time"]
        assert await bobs_list.receive_nothing(timeout=0.3)
        for communicator in (page, my_list, bobs_list):
            await communicator.disconnect()

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_appended_lines_reach_the_page_with_their_seq_and_cursor(team, alice):
    job = queued_job(team, alice)
    session = session_of(alice)

    async def scenario():
        page = socket(f"/ws/jobs/{job.pk}/", session)
        assert (await page.connect())[0]
        await database_sync_to_async(logstore.append)(job.pk, 1, wire_lines(0, 3))
        await database_sync_to_async(logstore.append)(job.pk, 1, wire_lines(1, 4))  # 2 resent
        first = await page.receive_json_from(timeout=5)
        second = await page.receive_json_from(timeout=5)
        await page.disconnect()
        return first, second

    first, second = run(scenario)
    assert first == {
        "type": "job.lines",
        "attempt": 1,
        "first_seq": 0,
        "cursor": first["cursor"],
        "lines": wire_lines(0, 3),
    }
    assert (second["first_seq"], [line["seq"] for line in second["lines"]]) == (3, [3, 4])
    stored = logstore.read(job.pk, first["cursor"], 10)
    assert [json.loads(raw)["seq"] for raw in stored.raw_lines] == [3, 4]
    assert stored.cursor == second["cursor"]


@pytest.mark.django_db
def test_lines_are_pushed_only_once_the_append_commits(
    team, alice, django_capture_on_commit_callbacks
):
    job = queued_job(team, alice)
    with django_capture_on_commit_callbacks() as callbacks:
        logstore.append(job.pk, 1, wire_lines(0, 2))
    assert len(callbacks) == 1  # the push waits for the commit


class SlowBrowser:
    """The ASGI app behind a slow link: a websocket send waits until the test reads it.

    So the consumer stops draining its channel while the test dawdles, the channel fills, and
    the layer drops what does not fit, as channels_redis does for a real slow page.
    """

    def __init__(self, app) -> None:
        self.app = app
        self.outbox: asyncio.Queue[dict] = asyncio.Queue(maxsize=1)

    async def __call__(self, scope, receive, send):
        async def slow_send(message):
            if message["type"] == "websocket.send":
                await self.outbox.put(json.loads(message["text"]))
            else:
                await send(message)

        await self.app(scope, receive, slow_send)


class LogsPage:
    """What static/js/logs.js shows, step for step: the tail, then pushed batches, each one
    that does not continue the last shown (attempt, seq) preceded by a fill through the API
    from the cursor; a final fill when the stream goes quiet."""

    def __init__(self, client: Client, job_id: int) -> None:
        self.client, self.url = client, f"/api/v1/jobs/{job_id}/logs"
        self.lines: list[dict] = []
        self.last = (-1, -1)
        self.cursor: str | None = None
        self.fills = 0

    async def get(self, **params) -> dict:
        response = await sync_to_async(self.client.get)(self.url, params)
        assert response.status_code == 200, response.content
        return json.loads(response.content)

    def append(self, lines: list[dict]) -> None:
        for line in lines:
            if (line["attempt"], line["seq"]) > self.last:
                self.lines.append(line)
                self.last = (line["attempt"], line["seq"])

    async def load_tail(self) -> None:
        page = await self.get(tail=TAIL)
        self.append(page["lines"])
        self.cursor = page["cursor"]

    async def fill(self, until: tuple[int, int] | None = None) -> None:
        self.fills += 1
        while True:
            page = await self.get(cursor=self.cursor, limit=PAGE)
            self.append(page["lines"])
            self.cursor = page["cursor"]
            if len(page["lines"]) < PAGE or (until and self.last >= until):
                return

    async def on_batch(self, message: dict) -> None:
        attempt = message["attempt"]

        def fresh():
            return [ln for ln in message["lines"] if (attempt, ln["seq"]) > self.last]

        def continues(lines):
            return lines and (attempt, lines[0]["seq"] - 1) == self.last

        lines = fresh()
        if not lines:
            return
        if not continues(lines):
            await self.fill((attempt, lines[0]["seq"] - 1))
            lines = fresh()
            if not continues(lines):
                return
        self.append([{"attempt": attempt, **line} for line in lines])
        self.cursor = message["cursor"]


@pytest.mark.django_db(transaction=True)
def test_a_flooded_job_page_ends_up_showing_exactly_the_stored_log(team, alice):
    job = queued_job(team, alice)
    logstore.append(job.pk, 1, wire_lines(0, 10))  # already there when the page opens
    page = LogsPage(signed_in(alice), job.pk)
    session = session_of(alice)

    half = 10 + (FLOOD_LINES - 10) // FLOOD_BATCH // 2 * FLOOD_BATCH

    async def write_flood(start: int, stop: int, then_attempt_2: bool = False):
        for first in range(start, stop, FLOOD_BATCH):
            count = min(FLOOD_BATCH, stop - first)
            await database_sync_to_async(logstore.append)(job.pk, 1, wire_lines(first, count))
        if then_attempt_2:
            await database_sync_to_async(logstore.append)(job.pk, 2, wire_lines(0, 300))

    async def scenario():
        browser = SlowBrowser(application)
        communicator = socket(f"/ws/jobs/{job.pk}/", session, app=browser)
        await page.load_tail()
        assert (await communicator.connect())[0]
        await page.fill()  # on open
        received = 0

        async def read_what_arrives():
            nonlocal received
            while True:
                try:
                    message = await asyncio.wait_for(browser.outbox.get(), 1.0)
                except TimeoutError:
                    return
                received += 1
                await asyncio.sleep(0.01)  # a slow page
                await page.on_batch(message)

        # The page stalls (a busy tab) while each half of the flood is written, so its channel
        # fills and the layer drops the rest of that half, however fast this machine writes;
        # the second half then starts past a gap the page must fill through the API.
        await write_flood(10, half)
        await read_what_arrives()
        await write_flood(half, FLOOD_LINES, then_attempt_2=True)
        await read_what_arrives()
        await page.fill()  # the quiet moment after the last message
        await communicator.disconnect()
        return received

    received = run(scenario)
    batches = len(range(10, FLOOD_LINES, FLOOD_BATCH)) + 1
    assert received < batches, "the layer dropped nothing: the scenario tests no gap"
    assert page.fills > 2

    stored = [json.loads(raw) for raw in logstore.read(job.pk, None, 100_000).raw_lines]
    assert len(stored) == FLOOD_LINES + 300
    assert page.lines == stored  # same lines, same order: no gap, no duplicate


@pytest.mark.django_db
def test_the_console_session_reads_the_api_and_needs_csrf_to_act(team, alice, theirs):
    job = queued_job(team, alice)
    browser = signed_in(alice, enforce_csrf_checks=True)
    assert browser.get(f"/api/v1/jobs/{job.pk}").json()["status"] == "QUEUED"
    assert browser.get("/api/v1/me").json()["username"] == "alice"
    assert browser.get(f"/api/v1/jobs/{theirs.pk}").status_code == 404

    refused = browser.post(f"/api/v1/jobs/{job.pk}/stop")
    assert refused.status_code == 403
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED

    secret = _get_new_csrf_string()
    browser.cookies["csrftoken"] = secret
    stopped = browser.post(f"/api/v1/jobs/{job.pk}/stop", HTTP_X_CSRFTOKEN=secret)
    assert stopped.status_code == 200 and stopped.json()["status"] == "STOPPED"


@pytest.mark.django_db
def test_a_bad_token_is_still_a_401_and_no_session_no_token_too(team, alice):
    job = queued_job(team, alice)
    bad = Client(HTTP_AUTHORIZATION="Bearer nope")
    assert bad.post(f"/api/v1/jobs/{job.pk}/stop").status_code == 401
    assert bad.get(f"/api/v1/jobs/{job.pk}").status_code == 401
    assert Client().get(f"/api/v1/jobs/{job.pk}").status_code == 401


@pytest.mark.django_db
def test_download_returns_every_attempt_as_text_and_404s_for_another_team(team, alice, api, theirs):
    job = queued_job(team, alice)
    logstore.append(job.pk, 1, wire_lines(0, 25_000))
    logstore.append(job.pk, 2, wire_lines(0, 3))
    response = api.get(f"/jobs/{job.pk}/logs/download")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert "attachment" in response["Content-Disposition"]
    text = run(streamed, response).decode()
    expected = (
        ["==> attempt 1 <=="]
        + [f"line {i}" for i in range(25_000)]
        + ["==> attempt 2 <=="]
        + [f"line {i}" for i in range(3)]
    )
    assert text == "\n".join(expected) + "\n"
    assert signed_in(alice).get(f"/api/v1/jobs/{job.pk}/logs/download").status_code == 200
    assert api.get(f"/jobs/{theirs.pk}/logs/download").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_ingested_metric_points_tell_the_open_page_to_redraw(team, alice):
    from jobs.job_tokens import job_token
    from tests.factories import with_attempt

    job = queued_job(team, alice)
    with_attempt(job, "RUNNING", job_ref="r")
    runner = Client(HTTP_AUTHORIZATION=f"Bearer {job_token(job.pk, 1)}")
    points = [
        {
            "seq": n,
            "kind": "train",
            "name": "loss",
            "step": n,
            "value": 1.0 / (n + 1),
            "ts": 1.0 + n,
        }
        for n in range(3)
    ]
    session = session_of(alice)

    async def scenario():
        page = socket(f"/ws/jobs/{job.pk}/", session)
        assert (await page.connect())[0]
        answer = await database_sync_to_async(runner.post)(
            "/api/v1/ingest/metrics",
            {"attempt": 1, "points": points},
            content_type="application/json",
        )
        assert answer.status_code == 200, answer.content
        message = await page.receive_json_from(timeout=5)
        await page.disconnect()
        return message

    assert run(scenario) == {"type": "job.metrics", "kinds": ["train"], "points": 3}
