"""The runner's log ingest (POST /api/v1/ingest/logs) and reading logs back (GET .../logs)."""

import datetime as dt
import json
import time

import pytest
from django.core import signing
from django.test import Client

from jobs.job_tokens import job_token
from jobs.models import Attempt, Job, JobEvent, LogStream
from jobs.stores import logstore
from tests.api_helpers import assert_refused, submit
from tests.ingesting import (
    T0,
    attach_attempt,
    finish,
    make_lines,
    now,
    runner,
    send_lines,
    stored,
)
from tests.ingesting import send_logs as send

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("storage")]  # on each store


def ledger(job_id: int) -> tuple:
    job = Job.objects.filter(pk=job_id).values("status", "status_reason", "attempt_count").get()
    streams = list(
        LogStream.objects.filter(job_id=job_id).values_list("attempt", "next_seq", "size")
    )
    return job, JobEvent.objects.filter(job_id=job_id).count(), streams, stored(job_id)


def logs(api, job_id: int, **params) -> dict:
    response = api.get(f"/jobs/{job_id}/logs", **params)
    assert response.status_code == 200, response.content
    return response.json()


def texts(body: dict) -> list[str]:
    return [line["text"] for line in body["lines"]]


@pytest.fixture
def job_id(api) -> int:
    """A RUNNING job whose current attempt is 1."""
    job_id = submit(api)
    attach_attempt(job_id, 1)
    return job_id


# -- writing ---------------------------------------------------------------------------------------


def test_a_batch_is_stored_in_order_and_counted(job_id):
    lines = make_lines(0, 3)
    response = send_lines(runner(job_id), [lines[2], lines[0], lines[1]])
    assert response.status_code == 200
    assert response.json() == {"accepted": 3, "duplicates": 0, "next_seq": 3, "dropped": 0}
    assert stored(job_id) == [f"attempt 1 line {s}" for s in range(3)]


def test_a_resent_batch_is_not_stored_twice_and_counts_duplicates(job_id):
    client = runner(job_id)
    send_lines(client, make_lines(0, 3))
    response = send_lines(client, make_lines(0, 3))
    assert response.json() == {"accepted": 0, "duplicates": 3, "next_seq": 3, "dropped": 0}
    assert stored(job_id) == [f"attempt 1 line {s}" for s in range(3)]


def test_an_overlapping_batch_stores_only_its_new_lines(job_id):
    client = runner(job_id)
    send_lines(client, make_lines(0, 3))
    response = send_lines(client, make_lines(1, 5))
    assert response.json() == {"accepted": 2, "duplicates": 2, "next_seq": 5, "dropped": 0}
    assert len(stored(job_id)) == 5


def test_a_line_repeated_inside_one_batch_is_stored_once(job_id):
    line = make_lines(0, 1)[0]
    response = send_lines(runner(job_id), [line, dict(line)])
    assert response.json() == {"accepted": 1, "duplicates": 1, "next_seq": 1, "dropped": 0}
    assert stored(job_id) == ["attempt 1 line 0"]


def test_a_gap_is_409_with_the_next_expected_seq_and_stores_nothing(job_id):
    client = runner(job_id)
    send_lines(client, make_lines(0, 2))
    before = ledger(job_id)
    body = assert_refused(send_lines(client, make_lines(4, 6)), 409, "expects 2")
    assert body["next_seq"] == 2
    assert ledger(job_id) == before


def test_a_gap_inside_a_batch_stores_nothing_of_it(job_id):
    client = runner(job_id)
    lines = make_lines(0, 5)
    before = ledger(job_id)
    body = assert_refused(send_lines(client, lines[:2] + lines[3:]), 409)
    assert body["next_seq"] == 2
    assert ledger(job_id) == before


def test_text_with_quotes_newlines_and_unicode_reads_back_unchanged(api, job_id):
    text = 'loss="0.1"\tépoque 1 ✓ \\ end\r'
    send_lines(runner(job_id), [{"seq": 0, "stream": "stderr", "ts": T0, "text": text}])
    line = logs(api, job_id)["lines"][0]
    assert (line["text"], line["stream"], line["seq"], line["attempt"]) == (text, "stderr", 0, 1)


def test_stored_lines_are_exactly_what_json_writes_for_them(job_id):
    texts_ = ['q"\\', "tab\tcr\r\x00\x1f\x7f", "épоque ✓ 😀", "", "\u2028 sep", "a\ud800b"]
    stamps = [T0, 1, 0.1, 1e16, 1.5e-7, -3]
    lines = [
        {"seq": i, "stream": ("stdout", "stderr")[i % 2], "ts": ts, "text": text}
        for i, (text, ts) in enumerate(zip(texts_, stamps, strict=True))
    ]
    logstore.append(job_id, 1, lines)
    expected = [
        json.dumps({"attempt": 1, **line}, ensure_ascii=False, separators=(",", ":")).encode(
            errors="replace"
        )
        for line in lines
    ]
    assert [raw.rstrip(b"\n") for raw in logstore.read(job_id, None, 100).raw_lines] == expected


def test_a_lone_surrogate_in_a_line_is_stored_as_a_replacement_not_a_500(api, job_id):
    body = (
        b'{"attempt": 1, "lines": [{"seq": 0, "stream": "stdout", "ts": 1, "text": "a\\ud800b"}]}'
    )
    response = send(runner(job_id), body)
    assert response.status_code == 200, response.content
    assert texts(logs(api, job_id)) == ["a?b"]


def test_a_token_of_another_job_writes_only_its_own_job(api, job_id):
    other = submit(api)
    attach_attempt(other, 1)
    before = ledger(job_id)
    response = send_lines(runner(other), make_lines(0, 2))
    assert response.json()["accepted"] == 2
    assert ledger(job_id) == before
    assert stored(other) == ["attempt 1 line 0", "attempt 1 line 1"]


def test_a_body_naming_another_attempt_than_the_token_is_400(job_id):
    before = ledger(job_id)
    assert_refused(send_lines(runner(job_id), make_lines(0, 1), attempt=2), 400, '"attempt": 1')
    assert ledger(job_id) == before


def test_a_forged_job_token_is_401(job_id):
    forged = job_token(job_id, 1)[:-2] + "xx"
    client = Client(HTTP_AUTHORIZATION=f"Bearer {forged}")
    before = ledger(job_id)
    assert_refused(send_lines(client, make_lines(0, 1)), 401, "token")
    assert ledger(job_id) == before


def test_a_token_signed_for_nothing_in_particular_is_401(job_id):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {signing.Signer().sign(f'{job_id}.1')}")
    assert_refused(send_lines(client, make_lines(0, 1)), 401)
    assert stored(job_id) == []


def test_a_user_token_cannot_ingest(api, job_id):
    response = api.client.post(
        "/api/v1/ingest/logs",
        {"attempt": 1, "lines": make_lines(0, 1)},
        content_type="application/json",
    )
    assert_refused(response, 401)
    assert stored(job_id) == []


def test_a_job_token_cannot_use_the_user_api(job_id):
    assert_refused(runner(job_id).get(f"/api/v1/jobs/{job_id}"), 401)


def test_a_job_finished_longer_than_the_grace_ago_is_410(job_id):
    finish(job_id, "SUCCEEDED", seconds_ago=121)
    before = ledger(job_id)
    assert_refused(send_lines(runner(job_id), make_lines(0, 1)), 410, "closed")
    assert ledger(job_id) == before


def test_a_job_that_just_finished_still_accepts_its_last_lines(job_id):
    finish(job_id, "FAILED", seconds_ago=5)
    assert send_lines(runner(job_id), make_lines(0, 1)).json()["accepted"] == 1


def test_a_token_of_a_superseded_attempt_is_410(job_id):
    attach_attempt(job_id, 2)
    before = ledger(job_id)
    assert_refused(send_lines(runner(job_id, 1), make_lines(0, 1)), 410, "attempt 1")
    assert ledger(job_id) == before


def test_a_token_naming_an_attempt_that_does_not_exist_is_401(job_id):
    # A job token carries its attempt's nonce: no row, no token.
    assert_refused(send_lines(runner(job_id, 7), make_lines(0, 1), attempt=7), 401)
    assert stored(job_id) == []


def test_a_batch_over_the_line_cap_is_413(job_id, settings):
    settings.SF_LOG_BATCH_MAX_LINES = 5
    before = ledger(job_id)
    assert_refused(send_lines(runner(job_id), make_lines(0, 6)), 413, "at most 5")
    assert ledger(job_id) == before
    assert send_lines(runner(job_id), make_lines(0, 5)).json()["accepted"] == 5


@pytest.mark.parametrize(
    "line",
    [
        {"stream": "stdout", "ts": T0, "text": "no seq"},
        {"seq": -1, "stream": "stdout", "ts": T0, "text": "negative"},
        {"seq": True, "stream": "stdout", "ts": T0, "text": "bool seq"},
        {"seq": "0", "stream": "stdout", "ts": T0, "text": "string seq"},
        {"seq": 0.0, "stream": "stdout", "ts": T0, "text": "float seq"},
        {"seq": 0, "stream": "stdlog", "ts": T0, "text": "unknown stream"},
        {"seq": 0, "stream": "stdout", "ts": "now", "text": "string ts"},
        {"seq": 0, "stream": "stdout", "ts": True, "text": "bool ts"},
        {"seq": 0, "stream": "stdout", "ts": 10**400, "text": "ts past any float"},
        {"seq": 0, "stream": "stdout", "ts": -2e12, "text": "ts before any clock"},
        {"seq": 0, "stream": "stdout", "ts": T0, "text": 5},
        {"seq": 0, "stream": "stdout", "ts": T0},
        "a bare string",
    ],
)
def test_a_malformed_line_is_400_and_nothing_of_the_batch_is_stored(job_id, line):
    before = ledger(job_id)
    response = send_lines(runner(job_id), [*make_lines(0, 1), line])
    assert_refused(response, 400, "line 1")
    assert ledger(job_id) == before


@pytest.mark.parametrize(
    "body",
    [
        b"seq=0",
        b"[]",
        b'{"lines": []}',
        b'{"attempt": true, "lines": []}',
        b'{"attempt": 1, "lines": {"seq": 0}}',
        b'{"attempt": 1, "lines": [{"seq": 0, "stream": "stdout", "ts": NaN, "text": "a"}]}',
        b'{"attempt": 1, "lines": [{"seq": 0, "stream": "stdout", "ts": Infinity, "text": "a"}]}',
    ],
)
def test_a_malformed_body_is_400_not_500(job_id, body):
    before = ledger(job_id)
    assert_refused(send(runner(job_id), body), 400)
    assert ledger(job_id) == before


# -- reading ---------------------------------------------------------------------------------------


def test_reading_without_a_cursor_starts_at_the_first_line(api, job_id):
    send_lines(runner(job_id), make_lines(0, 4))
    body = logs(api, job_id)
    assert texts(body) == [f"attempt 1 line {s}" for s in range(4)]
    assert (body["status"], body["done"]) == ("RUNNING", False)


def test_reading_a_job_with_no_lines_yet_answers_an_empty_page(api, job_id):
    body = logs(api, job_id)
    assert (body["lines"], body["done"]) == ([], False)


def test_tail_answers_the_last_n_lines(api, job_id):
    send_lines(runner(job_id), make_lines(0, 10))
    assert texts(logs(api, job_id, tail=3)) == [f"attempt 1 line {s}" for s in (7, 8, 9)]


def test_tail_larger_than_the_log_answers_all_of_it(api, job_id):
    send_lines(runner(job_id), make_lines(0, 3))
    assert len(logs(api, job_id, tail=50)["lines"]) == 3


def test_tail_spans_attempts(api, job_id):
    send_lines(runner(job_id), make_lines(0, 3))
    attach_attempt(job_id, 2)
    send_lines(runner(job_id, 2), make_lines(0, 2, attempt=2), attempt=2)
    assert texts(logs(api, job_id, tail=3)) == [
        "attempt 1 line 2",
        "attempt 2 line 0",
        "attempt 2 line 1",
    ]


def test_the_cursor_after_a_tail_sees_only_later_lines(api, job_id):
    client = runner(job_id)
    send_lines(client, make_lines(0, 5))
    cursor = logs(api, job_id, tail=2)["cursor"]
    send_lines(client, make_lines(5, 7))
    assert texts(logs(api, job_id, cursor=cursor)) == ["attempt 1 line 5", "attempt 1 line 6"]


def test_following_the_cursor_pages_through_every_line_exactly_once(api, job_id):
    send_lines(runner(job_id), make_lines(0, 11))
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 3} if cursor is None else {"limit": 3, "cursor": cursor}
        body = logs(api, job_id, **params)
        if not body["lines"]:
            break
        seen += texts(body)
        cursor, pages = body["cursor"], pages + 1
        assert pages <= 4
    assert seen == [f"attempt 1 line {s}" for s in range(11)]


def test_lines_of_attempt_2_come_after_attempt_1(api, job_id):
    send_lines(runner(job_id), make_lines(0, 3))
    attach_attempt(job_id, 2)
    send_lines(runner(job_id, 2), make_lines(0, 3, attempt=2), attempt=2)
    body = logs(api, job_id, limit=4)
    assert [(line["attempt"], line["seq"]) for line in body["lines"]] == [
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
    ]
    rest = logs(api, job_id, cursor=body["cursor"])
    assert [(line["attempt"], line["seq"]) for line in rest["lines"]] == [(2, 1), (2, 2)]


def test_a_cursor_at_the_end_of_attempt_1_moves_on_to_attempt_2(api, job_id):
    send_lines(runner(job_id), make_lines(0, 2))
    cursor = logs(api, job_id)["cursor"]
    attach_attempt(job_id, 2)
    send_lines(runner(job_id, 2), make_lines(0, 1, attempt=2), attempt=2)
    assert texts(logs(api, job_id, cursor=cursor)) == ["attempt 2 line 0"]


def test_done_is_false_while_the_job_runs_even_at_the_end(api, job_id):
    send_lines(runner(job_id), make_lines(0, 2))
    assert logs(api, job_id)["done"] is False


def test_done_is_false_for_a_finished_job_until_the_reader_reaches_the_end(api, job_id):
    send_lines(runner(job_id), make_lines(0, 4))
    finish(job_id, "SUCCEEDED")
    first = logs(api, job_id, limit=2)
    assert (first["status"], first["done"]) == ("SUCCEEDED", False)
    last = logs(api, job_id, cursor=first["cursor"], limit=2)
    assert (texts(last), last["done"]) == (["attempt 1 line 2", "attempt 1 line 3"], True)


def test_done_is_true_for_a_finished_job_without_any_lines(api, job_id):
    finish(job_id, "FAILED")
    assert logs(api, job_id)["done"] is True


def test_follow_on_a_finished_job_returns_at_once(api, job_id):
    send_lines(runner(job_id), make_lines(0, 1))
    finish(job_id, "STOPPED")
    cursor = logs(api, job_id)["cursor"]
    body = logs(api, job_id, cursor=cursor, follow="true", wait=30)
    assert (body["lines"], body["done"]) == ([], True)


def test_follow_waits_no_longer_than_asked_when_nothing_comes(api, job_id):
    started = time.monotonic()
    body = logs(api, job_id, follow="true", wait=0.3)
    assert body["lines"] == [] and body["done"] is False
    assert 0.25 <= time.monotonic() - started < 5
    assert body["poll_after_s"] == 0  # held the whole wait: ask again at once


def test_a_follow_not_held_answers_at_once_and_says_when_to_ask_again(api, job_id, settings):
    """Under WSGI (SF_LOG_FOLLOW_HOLD_S=0) a follower must not keep a sync worker waiting."""
    settings.SF_LOG_FOLLOW_HOLD_S = 0
    started = time.monotonic()
    body = logs(api, job_id, follow="true", wait=20, poll="true")
    assert time.monotonic() - started < 2
    assert (body["lines"], body["done"], body["poll_after_s"]) == ([], False, 1.0)
    send_lines(runner(job_id), make_lines(0, 2))
    body = logs(api, job_id, cursor=body["cursor"], follow="true", wait=20, poll="true")
    assert (len(body["lines"]), body["poll_after_s"]) == (2, 0)  # lines: read on at once
    finish(job_id, "SUCCEEDED")
    body = logs(api, job_id, cursor=body["cursor"], follow="true", wait=20, poll="true")
    assert (body["done"], body["poll_after_s"]) == (True, 0)


def test_a_follow_from_a_client_that_does_not_pause_is_held_as_it_asks(api, job_id, settings):
    """Answered at once, an older `sf` (no poll=true) would ask again at once, over and over."""
    settings.SF_LOG_FOLLOW_HOLD_S = 0
    started = time.monotonic()
    body = logs(api, job_id, follow="true", wait=0.3)
    assert 0.25 <= time.monotonic() - started < 5
    assert (body["lines"], body["poll_after_s"]) == ([], 0)


@pytest.mark.parametrize("cursor", ["abc", "1:5", "-1:0", "1:-3", "1:2:3", "1:999999", "9:0"])
def test_a_bad_cursor_is_400(api, job_id, cursor):
    send_lines(runner(job_id), make_lines(0, 3))
    assert_refused(api.get(f"/jobs/{job_id}/logs", cursor=cursor), 400, "cursor")


@pytest.mark.parametrize("params", [{"limit": 0}, {"tail": -1}, {"wait": 31}])
def test_read_parameters_out_of_range_are_422(api, job_id, params):
    assert_refused(api.get(f"/jobs/{job_id}/logs", **params), 422)


def test_a_viewer_can_read_logs(api, api_as, make_user, team, job_id):
    send_lines(runner(job_id), make_lines(0, 1))
    viewer = api_as(make_user("victor", team, role="viewer"))
    assert texts(logs(viewer, job_id)) == ["attempt 1 line 0"]


def test_logs_of_another_team_are_404(api_as, make_team, make_user, job_id):
    send_lines(runner(job_id), make_lines(0, 1))
    stranger = api_as(make_user("carol", make_team("audio")))
    assert_refused(stranger.get(f"/jobs/{job_id}/logs"), 404)


def post_started(client: Client, body) -> object:
    return client.post("/api/v1/ingest/started", body, content_type="application/json")


def test_the_runners_start_report_sets_start_time_once_by_the_servers_clock(api):
    job_id = submit(api)
    attempt = attach_attempt(job_id, 1, status="PENDING")
    before = now()
    answer = post_started(runner(job_id), {"attempt": 1})
    assert answer.status_code == 200, answer.content
    attempt.refresh_from_db()
    assert before <= attempt.start_time <= now()
    first = attempt.start_time
    assert post_started(runner(job_id), {"attempt": 1}).status_code == 200
    attempt.refresh_from_db()
    assert attempt.start_time == first  # counted once, never moved


def test_a_start_report_is_refused_for_another_attempt_a_bad_body_or_a_closed_attempt(api):
    job_id = submit(api)
    attach_attempt(job_id, 1, status="PENDING")
    attempt = attach_attempt(job_id, 2, status="PENDING")  # attempt 1 was paused
    assert_refused(post_started(runner(job_id, 2), {"attempt": 1}), 400, '"attempt": 2')
    assert_refused(post_started(runner(job_id, 2), "nope"), 400, "not JSON")
    assert_refused(post_started(runner(job_id, 1), {"attempt": 1}), 410, "is over")
    Attempt.objects.filter(pk=attempt.pk).update(end_time=now())  # stopped while starting
    assert post_started(runner(job_id, 2), {"attempt": 2}).status_code == 200
    attempt.refresh_from_db()
    assert attempt.start_time is None  # a closed attempt keeps what it has


def post_checkpoint(client: Client, body) -> object:
    return client.post("/api/v1/ingest/checkpoint", body, content_type="application/json")


def test_the_newest_checkpoint_is_kept_only_moving_forward_never_past_now(api):
    job_id = submit(api)
    attempt = attach_attempt(job_id, 1)
    earlier = now() - dt.timedelta(minutes=5)
    answer = post_checkpoint(runner(job_id), {"attempt": 1, "saved_at": earlier.timestamp()})
    assert answer.status_code == 200, answer.content
    attempt.refresh_from_db()
    assert abs((attempt.checkpoint_at - earlier).total_seconds()) < 0.01
    older = earlier - dt.timedelta(minutes=5)
    post_checkpoint(runner(job_id), {"attempt": 1, "saved_at": older.timestamp()})
    attempt.refresh_from_db()
    assert abs((attempt.checkpoint_at - earlier).total_seconds()) < 0.01  # never back
    before = now()
    # A job sets its files' mtime as it likes: a time in the future is now, by our clock.
    post_checkpoint(runner(job_id), {"attempt": 1, "saved_at": 4e10})
    attempt.refresh_from_db()
    assert before <= attempt.checkpoint_at <= now()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"attempt": 1}, '"saved_at" must be a positive number'),
        ({"attempt": 1, "saved_at": "yesterday"}, '"saved_at" must be a positive number'),
        ({"attempt": 1, "saved_at": True}, '"saved_at" must be a positive number'),
        ({"attempt": 1, "saved_at": -5}, '"saved_at" must be a positive number'),
        ({"attempt": 2, "saved_at": 1e9}, '"attempt": 1'),
    ],
)
def test_a_bad_checkpoint_report_is_400_and_changes_nothing(api, body, words):
    job_id = submit(api)
    attempt = attach_attempt(job_id, 1)
    answer = post_checkpoint(runner(job_id), body)
    assert answer.status_code == 400 and words in answer.json()["detail"]
    attempt.refresh_from_db()
    assert attempt.checkpoint_at is None


def test_a_checkpoint_report_needs_the_attempts_own_job_token(api):
    job_id = submit(api)
    attach_attempt(job_id, 1)
    other = submit(api)
    attach_attempt(other, 1)
    assert post_checkpoint(runner(other), {"attempt": 1, "saved_at": 1e9}).status_code == 200
    assert Attempt.objects.get(job_id=job_id).checkpoint_at is None
    assert_refused(post_checkpoint(api.client, {"attempt": 1, "saved_at": 1e9}), 401)
    assert Attempt.objects.get(job_id=job_id).checkpoint_at is None
