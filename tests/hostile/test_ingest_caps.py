"""Bounded ingest (issue 12, point 10): one job cannot fill the disk that holds the ledger.

An attempt stores at most SF_ATTEMPT_MAX_LOG_BYTES of log and SF_ATTEMPT_MAX_METRIC_POINTS
points. Past the cap the runner's batches are still answered 200 (with `dropped`, so it does
not resend them forever), ONE note line goes into the log and ONE NOTE event into the
timeline, and nothing stored before is lost. Against the code before the caps, every line and
point is stored and the answers carry no `dropped`.
"""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import JobEvent, LogStream
from jobs.stores import logstore
from jobs.stores.metrics.chunks import stored_points
from tests.api_helpers import submit
from tests.ingesting import (
    attach_attempt,
    make_lines,
    make_points,
    runner,
    send_lines,
    send_points,
    stored,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("storage")]  # on each store


@pytest.fixture
def job_id(api) -> int:
    job_id = submit(api)
    attach_attempt(job_id, 1)
    return job_id


def line_bytes(seq: int, attempt: int = 1) -> int:
    return len(logstore._encode(attempt, make_lines(seq, seq + 1, attempt)))


def notes(job_id: int) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job_id=job_id, kind=JobEvent.Kind.NOTE).order_by("pk"))


# -- logs ----------------------------------------------------------------------------------------


def test_lines_past_the_log_cap_are_dropped_with_one_note_and_one_event(job_id, settings):
    cap = sum(line_bytes(s) for s in range(5))  # exactly five lines fit
    settings.SF_ATTEMPT_MAX_LOG_BYTES = cap
    client = runner(job_id)
    first = send_lines(client, make_lines(0, 3))
    assert first.status_code == 200
    assert first.json() == {"accepted": 3, "duplicates": 0, "next_seq": 3, "dropped": 0}

    over = send_lines(client, make_lines(3, 9))  # two fit, four do not
    assert over.status_code == 200, over.content
    assert over.json() == {"accepted": 2, "duplicates": 0, "next_seq": 9, "dropped": 4}
    texts = stored(job_id)
    assert texts[:5] == [f"attempt 1 line {s}" for s in range(5)]  # nothing earlier lost
    note = f"log limit of {cap / 2**20:g} MB reached for attempt 1; further lines are dropped"
    assert texts[5:] == [note]
    [event] = notes(job_id)
    assert (event.reason, event.attempt, event.actor) == (note, 1, "ingest")

    # Later batches: answered 200, all dropped, no second note, the runner's seqs go on.
    for start in (9, 20):
        later = send_lines(client, make_lines(start, start + 11 if start == 9 else 30))
        assert later.status_code == 200, later.content
        assert later.json()["accepted"] == 0 and later.json()["dropped"] > 0
    assert stored(job_id) == [*[f"attempt 1 line {s}" for s in range(5)], note]
    assert len(notes(job_id)) == 1
    stream = LogStream.objects.get(job_id=job_id, attempt=1)
    assert stream.next_seq == 30 and stream.dropped_lines == 4 + 11 + 10


def test_the_note_line_has_the_first_dropped_seq_so_readers_see_no_gap(job_id, settings):
    settings.SF_ATTEMPT_MAX_LOG_BYTES = line_bytes(0) + line_bytes(1)
    send_lines(runner(job_id), make_lines(0, 4))
    page = logstore.read(job_id, None, 100)
    lines = [json.loads(raw) for raw in page.raw_lines]
    assert [(ln["seq"], ln["stream"]) for ln in lines] == [
        (0, "stdout"),
        (1, "stdout"),
        (2, "stderr"),
    ]


def test_a_resend_of_dropped_lines_counts_as_duplicates_not_a_second_note(job_id, settings):
    settings.SF_ATTEMPT_MAX_LOG_BYTES = line_bytes(0)
    client = runner(job_id)
    assert send_lines(client, make_lines(0, 3)).json()["dropped"] == 2
    again = send_lines(client, make_lines(0, 3))
    assert again.json() == {"accepted": 0, "duplicates": 3, "next_seq": 3, "dropped": 0}
    assert len(notes(job_id)) == 1


def test_each_attempt_has_its_own_log_budget(job_id, settings):
    settings.SF_ATTEMPT_MAX_LOG_BYTES = line_bytes(0)
    send_lines(runner(job_id), make_lines(0, 2))
    attach_attempt(job_id, 2)
    second = send_lines(runner(job_id, 2), make_lines(0, 1, attempt=2), attempt=2)
    assert second.json()["accepted"] == 1 and second.json()["dropped"] == 0


def test_one_line_larger_than_the_whole_cap_is_dropped_not_refused(job_id, settings):
    settings.SF_ATTEMPT_MAX_LOG_BYTES = 1000
    line = {"seq": 0, "stream": "stdout", "ts": 1.0, "text": "x" * 5000}
    response = send_lines(runner(job_id), [line])
    assert response.status_code == 200
    assert response.json()["dropped"] == 1
    assert stored(job_id) == [
        f"log limit of {1000 / 2**20:g} MB reached for attempt 1; further lines are dropped"
    ]


@pytest.mark.parametrize("storage", ["local"], indirect=True)  # in S3 a batch is a chunk: below
def test_below_the_cap_a_batch_costs_no_more_queries(job_id, settings):
    """The cap reads the stream row the append locks anyway and writes in its one UPDATE."""
    client = runner(job_id)
    send_lines(client, make_lines(0, 10))
    with CaptureQueriesContext(connection) as queries:
        logstore.append(job_id, 1, make_lines(10, 1010))
    sql = [q["sql"] for q in queries.captured_queries]
    read, write = [s for s in sql if not s.startswith(("SAVEPOINT", "RELEASE"))]
    assert read.startswith("SELECT") and '"jobs_logstream"' in read
    assert write.startswith('UPDATE "jobs_logstream"')
    if connection.features.has_select_for_update:  # SQLite locks the whole file instead
        assert "FOR UPDATE" in read


@pytest.mark.s3
@pytest.mark.parametrize("storage", ["s3"], indirect=True)
def test_below_the_cap_a_batch_is_one_insert_more_than_on_disk(job_id):
    send_lines(runner(job_id), make_lines(0, 10))
    with CaptureQueriesContext(connection) as queries:
        logstore.append(job_id, 1, make_lines(10, 1010))
    sql = [q["sql"] for q in queries.captured_queries]
    read, chunk, write = [s for s in sql if not s.startswith(("SAVEPOINT", "RELEASE"))]
    assert read.startswith("SELECT") and '"jobs_logstream"' in read
    assert chunk.startswith('INSERT INTO "jobs_logchunk"')
    assert write.startswith('UPDATE "jobs_logstream"')
    if connection.features.has_select_for_update:  # SQLite locks the whole file instead
        assert "FOR UPDATE" in read


# -- metrics ---------------------------------------------------------------------------------------


def test_points_past_the_metric_cap_are_dropped_with_one_event(job_id, settings):
    settings.SF_ATTEMPT_MAX_METRIC_POINTS = 5
    client = runner(job_id)
    assert send_points(client, make_points(0, 3)).json() == {
        "accepted": 3,
        "duplicates": 0,
        "dropped": 0,
    }
    over = send_points(client, make_points(3, 10))
    assert over.status_code == 200, over.content
    assert over.json() == {"accepted": 2, "duplicates": 0, "dropped": 5}
    later = send_points(client, make_points(10, 20))
    assert later.status_code == 200
    assert later.json() == {"accepted": 0, "duplicates": 0, "dropped": 10}
    seqs = [seq for _, seq, *_ in stored_points(job_id)]
    assert seqs == [0, 1, 2, 3, 4]  # the first five, none lost
    [event] = notes(job_id)
    assert event.reason == (
        "metric limit of 5 points reached for attempt 1; further points are dropped"
    )
    # A resend of stored points is still counted as duplicates.
    assert send_points(client, make_points(0, 5)).json() == {
        "accepted": 0,
        "duplicates": 5,
        "dropped": 0,
    }


def test_each_attempt_has_its_own_metric_budget(job_id, settings):
    settings.SF_ATTEMPT_MAX_METRIC_POINTS = 2
    send_points(runner(job_id), make_points(0, 4))
    attach_attempt(job_id, 2)
    second = send_points(runner(job_id, 2), make_points(0, 2), attempt=2)
    assert second.json() == {"accepted": 2, "duplicates": 0, "dropped": 0}


def test_the_series_read_sees_only_stored_points(job_id, settings, api):
    settings.SF_ATTEMPT_MAX_METRIC_POINTS = 3
    send_points(runner(job_id), make_points(0, 10))
    body = api.get(f"/jobs/{job_id}/metrics").json()
    assert body["series"]["loss"]["total"] == 3
    assert body["latest"]["loss"]["step"] == 2


def test_the_defaults_are_generous():
    from jobs.stores.metrics.ingest import max_points

    assert logstore.max_log_bytes() >= 1024 * 2**20
    assert max_points() >= 5_000_000
