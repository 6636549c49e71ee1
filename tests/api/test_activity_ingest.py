"""The runner's activity reports and dumps through the API: checked as a job's input, rolled
up by metering by the server's clock (never more than billed), the dump asked for as a stall
nears hang_after, and the figures in the job's JSON."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.api.activity import DUMP_MAX_CHARS
from jobs.models import ActivityPolicy, Attempt, AttemptActivity
from tests.factories import queued_job
from tests.ingesting import attach_attempt, runner

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(team, alice):
    """A RUNNING job on 2 GPUs that started 30 s ago."""
    job = queued_job(team, alice, total_gpus=2)
    attempt = attach_attempt(job.pk, 1)
    start = timezone.now() - dt.timedelta(seconds=30)
    Attempt.objects.filter(pk=attempt.pk).update(start_time=start, total_gpus=2)
    return job


def report(job, **body):
    return runner(job.pk).post(
        "/api/v1/ingest/activity", {"attempt": 1, **body}, content_type="application/json"
    )


def rank(**fields):
    return {"rank": 0, "lines": 0, "cpu_s": 0.0, "gpu_util": [], **fields}


def test_a_report_counts_its_interval_active_or_idle_and_the_job_shows_it(running, api):
    answer = report(running, steps=0, ranks=[rank(gpu_util=[95.0, 2.0])])
    assert answer.status_code == 200 and answer.json() == {"dump": False}
    row = AttemptActivity.objects.get()
    # From the start 30 s ago: one GPU worked, one idled (GAP_CAP_S is 60 s).
    assert row.active_gpu_us == pytest.approx(30e6, rel=0.15)
    assert row.idle_gpu_us == pytest.approx(30e6, rel=0.15)
    shown = api.get(f"/jobs/{running.pk}").json()
    assert shown["active_gpu_seconds"] == pytest.approx(30, rel=0.15)
    assert shown["efficiency"] == pytest.approx(0.5, rel=0.15)


def test_without_gpu_readings_a_silent_rank_is_idle_and_a_busy_one_active(running):
    report(running, ranks=[rank(cpu_s=0.0)])
    AttemptActivity.objects.update(reported_at=timezone.now() - dt.timedelta(seconds=10))
    report(running, ranks=[rank(lines=3)])
    row = AttemptActivity.objects.get()
    assert row.idle_gpu_us == pytest.approx(60e6, rel=0.15)  # 30 s x 2 GPUs, silent
    assert row.active_gpu_us == pytest.approx(20e6, rel=0.1)  # 10 s x 2 GPUs, a line


def test_a_forged_report_never_shows_more_than_was_billed(running, api):
    AttemptActivity.objects.create(attempt=Attempt.objects.get(job=running), active_gpu_us=10**15)
    shown = api.get(f"/jobs/{running.pk}").json()
    assert shown["active_gpu_seconds"] <= shown["gpu_seconds"]
    assert shown["efficiency"] == 1.0 and shown["idle_gpu_seconds"] == 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"ranks": [rank(rank=5)]}, "rank below 1"),
        ({"ranks": [rank(gpu_util=[150])]}, "percents from 0 to 100"),
        ({"ranks": [rank(cpu_s=-1)]}, "non-negative"),
        ({"steps": True}, "whole number"),
        ({"ranks": "all"}, "a list"),
    ],
)
def test_a_bad_report_gets_a_sentence_not_a_500(running, body, says):
    answer = report(running, **body)
    assert answer.status_code == 400 and says in answer.json()["detail"]


def test_the_dump_is_asked_for_as_a_stall_nears_hang_after_and_kept_bounded(running, team):
    ActivityPolicy.objects.create(team=team, hang_after_s=20)  # asked 10 s before: at 10 s
    assert report(running, ranks=[rank()]).json() == {"dump": True}  # stalled 30 s
    text = "<script>x</script>" + "f" * DUMP_MAX_CHARS
    dumps = [{"rank": 0, "text": text}]
    answer = runner(running.pk).post(
        "/api/v1/ingest/dumps", {"attempt": 1, "dumps": dumps}, content_type="application/json"
    )
    assert answer.status_code == 200
    (kept,) = AttemptActivity.objects.get().dumps
    assert len(kept["text"]) < DUMP_MAX_CHARS + 100 and kept["text"].endswith("server keeps]")
    assert report(running, ranks=[rank()]).json() == {"dump": False}  # fresh dumps are here
    bad = runner(running.pk).post(
        "/api/v1/ingest/dumps",
        {"attempt": 1, "dumps": [{"rank": 3, "text": "x"}]},
        content_type="application/json",
    )
    assert bad.status_code == 400
