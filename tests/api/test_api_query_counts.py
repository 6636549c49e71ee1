"""The API's hot reads stay cheap: a pinned number of queries whatever the page holds, and
answers that conform to their documented schemas although ninja no longer re-validates them."""

import datetime as dt
import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from ninja.renderers import JSONRenderer

from jobs.models import Job
from jobs.schemas import EventOut, JobOut, JobPage
from tests.api_helpers import submit
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
TIME_TO_THE_SECOND = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.000Z")


def queries(api, path: str) -> int:
    api.get(path)  # the token's first use records it (once a minute), a write not counted here
    with CaptureQueriesContext(connection) as captured:
        response = api.get(path)
    assert response.status_code == 200, response.content
    # A transaction's BEGIN (SQLite) is not a read.
    return sum(1 for q in captured.captured_queries if not q["sql"].startswith("BEGIN"))


def as_validated(schema, body):
    """`body` as ninja would answer it after validating it against `schema`, both with their
    times to the millisecond written alike: Django's ECMA-262 rule writes a time less than a
    millisecond past the second as ".000Z", which reads back as the whole second ("Z")."""
    dumped = schema.model_validate(body).model_dump()
    return _whole_seconds(json.loads(JSONRenderer().render(None, dumped, response_status=200)))


def _whole_seconds(value):
    if isinstance(value, dict):
        return {key: _whole_seconds(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_seconds(item) for item in value]
    if isinstance(value, str) and TIME_TO_THE_SECOND.fullmatch(value):
        return value.removesuffix(".000Z") + "Z"
    return value


@pytest.fixture
def jobs(team, alice):
    """Jobs in several states, two with attempts that ran, one with ranks."""
    made = [queued_job(team, alice, total_gpus=1) for _ in range(5)]
    start = timezone.now() - dt.timedelta(hours=1)
    with_attempt(made[0], "SUCCEEDED", start_time=start, end_time=start + dt.timedelta(seconds=90))
    ranks = [{"rank": 0, "node": "n0", "state": "running", "exit_code": None}]
    with_attempt(made[1], "RUNNING", start_time=start, ranks=ranks)
    with_attempt(made[2], "PENDING")
    return made


def test_a_job_read_is_three_queries(api, jobs):
    # The token with its user, the job with what it shows joined, its started attempts.
    assert queries(api, f"/jobs/{jobs[0].pk}") == 3


def test_a_read_of_a_job_that_never_started_is_two_queries(api, jobs):
    # No attempt of it started: there are no GPU-seconds to read.
    assert queries(api, f"/jobs/{jobs[2].pk}") == queries(api, f"/jobs/{jobs[4].pk}") == 2


def test_a_page_of_jobs_is_three_queries_however_many_it_holds(api, team, alice, jobs):
    few = queries(api, "/jobs?limit=50")
    for _ in range(10):
        with_attempt(queued_job(team, alice), "PENDING")
    assert queries(api, "/jobs?limit=50") == few == 3
    # A page of jobs none of which ever started (the newest ten) needs no attempts.
    assert queries(api, "/jobs?limit=10") == 2


def test_a_retried_job_bills_its_earlier_attempts_while_its_current_one_waits(api, team, alice):
    job = queued_job(team, alice, total_gpus=2)
    start = timezone.now() - dt.timedelta(hours=1)
    with_attempt(job, "FAILED", start_time=start, end_time=start + dt.timedelta(seconds=90))
    job.refresh_from_db()
    with_attempt(job, "PENDING")  # the retry, not started
    assert api.get(f"/jobs/{job.pk}").json()["gpu_seconds"] == 180.0
    [listed] = [j for j in api.get("/jobs").json()["items"] if j["id"] == job.pk]
    assert listed["gpu_seconds"] == 180.0


def test_a_timeline_is_two_queries(api, jobs):
    assert queries(api, f"/jobs/{jobs[0].pk}/events") == 2


def test_the_answers_conform_to_their_schemas(api, jobs):
    page = api.get("/jobs").json()
    assert as_validated(JobPage, page) == _whole_seconds(page)
    one = api.get(f"/jobs/{jobs[1].pk}").json()
    assert as_validated(JobOut, one) == _whole_seconds(one)
    assert one["ranks"] == [{"rank": 0, "node": "n0", "state": "running", "exit_code": None}]
    assert one["gpu_seconds"] > 3000
    done = api.get(f"/jobs/{jobs[0].pk}").json()
    assert (done["gpu_seconds"], done["terminal"], done["ended_at"] is not None) == (
        90.0,
        True,
        True,
    )
    events = api.get(f"/jobs/{submit(api)}/events").json()
    assert events and all(as_validated(EventOut, e) == _whole_seconds(e) for e in events)


def test_a_job_without_attempts_shows_zero_gpu_seconds_as_a_float(api, jobs):
    content = api.get(f"/jobs/{jobs[4].pk}").content
    assert len(re.findall(rb'"gpu_seconds":\s*0\.0[,}]', content)) == 1, content


def test_prepared_reads_follow_each_request_s_reader(api, api_as, make_team, make_user, jobs):
    """The SQL is built once; who reads still decides what is found."""
    carol = api_as(make_user("carol", make_team("audio")))
    assert api.get(f"/jobs/{jobs[0].pk}").status_code == 200
    assert carol.get(f"/jobs/{jobs[0].pk}").status_code == 404
    assert carol.get(f"/jobs/{jobs[0].pk}/events").status_code == 404
    assert carol.get("/jobs").json()["items"] == []


def test_a_time_under_a_millisecond_past_the_second_conforms_too(api, team, alice):
    job = queued_job(team, alice)
    Job.objects.filter(pk=job.pk).update(
        submitted_at=dt.datetime(2026, 12, 7, 1, 2, 3, 500, tzinfo=dt.UTC)
    )
    one = api.get(f"/jobs/{job.pk}").json()
    assert one["submitted_at"] == "2026-12-07T01:02:03.000Z"
    assert as_validated(JobOut, one) == _whole_seconds(one)
