"""GPU-seconds by day and the usage page: only running time, split at midnight, own teams."""

import datetime as dt

import pytest
from django.test import Client

from metering.usage import attempt_gpu_seconds, gpu_seconds_by_day
from tests.jobs.factories import queued_job, with_attempt

T0 = dt.datetime(2026, 11, 10, 22, 0, tzinfo=dt.UTC)
MONTH = dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def test_queued_and_pending_time_is_never_billed():
    assert attempt_gpu_seconds(None, T0, gpus=4) == 0.0
    assert attempt_gpu_seconds(T0, T0 + dt.timedelta(seconds=90), gpus=2) == 180.0


def test_an_attempt_across_midnight_is_split_between_the_days():
    attempt = ("vision", "alice", T0, T0 + dt.timedelta(hours=3), 2)
    rows = gpu_seconds_by_day([attempt], *MONTH, now=T0 + dt.timedelta(days=1))
    assert rows == {
        (dt.date(2026, 11, 10), "vision", "alice"): 2 * 3600 * 2,
        (dt.date(2026, 11, 11), "vision", "alice"): 1 * 3600 * 2,
    }


def test_a_running_attempt_accrues_up_to_now_and_the_month_clips_it():
    running = ("vision", "alice", dt.datetime(2026, 10, 31, 23, 0, tzinfo=dt.UTC), None, 1)
    rows = gpu_seconds_by_day([running], *MONTH, now=dt.datetime(2026, 11, 1, 0, 30, tzinfo=dt.UTC))
    assert rows == {(dt.date(2026, 11, 1), "vision", "alice"): 1800.0}


@pytest.mark.django_db
def test_usage_page_shows_my_teams_hours_only(team, alice, make_team, make_user):
    now = dt.datetime.now(dt.UTC)
    start = now - dt.timedelta(minutes=30)
    with_attempt(
        queued_job(team, alice, gpus=2),
        "SUCCEEDED",
        job_ref="r",
        start_time=start,
        end_time=start + dt.timedelta(minutes=30),
    )
    other = make_team("nlp")
    with_attempt(
        queued_job(other, make_user("bob", other)), "RUNNING", job_ref="s", start_time=start
    )
    client = Client()
    client.force_login(alice)
    page = client.get("/usage/").content.decode()
    assert "<td>vision</td><td>1.00</td>" in page
    assert "nlp" not in page and "bob" not in page
