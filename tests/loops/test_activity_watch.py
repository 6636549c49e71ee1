"""The activity watch's step on its own (`watch_activity`, an injected clock): the idle
policy's warning, then notice and pause, each once; an exempt job left alone; a suspected hang
reported once per stall with its dumps (escaped on the job page) and its notification."""

import datetime as dt
import re

import pytest
from django.utils import timezone

from jobs.loops.activity import watch_activity
from jobs.models import (
    ActivityPolicy,
    AttemptActivity,
    IdleExemption,
    Job,
    JobEvent,
    Webhook,
    WebhookDelivery,
)
from jobs.states import JobStatus
from jobs.webhooks.send import payload, slack_text, summary
from tests.factories import queued_job, with_attempt
from tests.sockets import signed_in

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


@pytest.fixture
def running(team, alice):
    job = queued_job(team, alice)
    attempt = with_attempt(job, JobStatus.RUNNING, start_time=ago(100))
    return job, attempt


def reasons(job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("reason", flat=True))


def test_idle_past_idle_after_is_warned_once_then_noticed_and_paused_after_the_grace(running, team):
    job, attempt = running
    ActivityPolicy.objects.create(team=team, idle_after_s=30, idle_grace_s=20)
    AttemptActivity.objects.create(attempt=attempt, busy_at=ago(40), moved_at=ago(40))
    Webhook.objects.create(owner=job.user, url="https://example.com/h", events=["idle"])
    assert watch_activity(NOW).warned == [job.pk]
    assert watch_activity(NOW + dt.timedelta(seconds=5)).warned == []  # once per idle spell
    assert WebhookDelivery.objects.filter(event="idle").count() == 1
    assert watch_activity(NOW + dt.timedelta(seconds=21)).noticed == [job.pk]
    job.refresh_from_db()
    assert job.status == JobStatus.PAUSED and "idle policy" in job.status_reason
    said = reasons(job)
    assert [r.split(":")[0].split(" for")[0] for r in said[-3:]] == [
        "idle", "checkpoint notice", said[-1].split(":")[0].split(" for")[0],
    ]  # fmt: skip


def test_work_since_the_warning_starts_a_new_spell(running, team):
    job, attempt = running
    ActivityPolicy.objects.create(team=team, idle_after_s=30, idle_grace_s=20)
    AttemptActivity.objects.create(attempt=attempt, busy_at=ago(40), moved_at=ago(40))
    watch_activity(NOW)
    AttemptActivity.objects.update(busy_at=NOW + dt.timedelta(seconds=1))
    result = watch_activity(NOW + dt.timedelta(seconds=25))
    assert result.noticed == [] and result.warned == []
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_a_job_a_team_admin_exempted_is_never_warned(running, team, alice):
    job, attempt = running
    ActivityPolicy.objects.create(team=team, idle_after_s=30)
    IdleExemption.objects.create(job=job, by=alice, at=NOW)
    assert watch_activity(NOW).warned == []


def test_a_stall_is_reported_once_with_its_dumps_escaped_on_the_page(running, team, alice):
    job, attempt = running
    ActivityPolicy.objects.create(team=team, hang_after_s=30)
    dump = "Thread 1 (idle)\n    waiting_here (train.py:9)\n<script>alert(1)</script>"
    AttemptActivity.objects.create(
        attempt=attempt, moved_at=ago(40), stepped_at=ago(40), busy_at=ago(40),
        ranks_moved={"0": ago(40).timestamp()}, dumps=[{"rank": 0, "text": dump}],
        dumps_at=ago(5),
    )  # fmt: skip
    Webhook.objects.create(owner=alice, url="https://example.com/h", events=["suspected-hang"])
    assert watch_activity(NOW).hung == [job.pk]
    assert watch_activity(NOW + dt.timedelta(seconds=3)).hung == []
    (event,) = JobEvent.objects.filter(job=job, reason__startswith="suspected hang")
    assert event.data["dumps"][0]["text"] == dump and event.data["action"] == "notify"
    (delivery,) = WebhookDelivery.objects.filter(event="suspected-hang")
    body = payload(delivery, NOW)
    assert body["activity"]["dumps"][0]["text"] == dump  # in the notification, as data
    line = slack_text(summary(body))
    assert "is suspected hung: suspected hang: no progress for" in line
    assert "<script>" not in line
    page = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "waiting_here (train.py:9)" in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page


def test_a_stall_waits_for_its_dumps_then_goes_without_them(running, team):
    job, attempt = running
    ActivityPolicy.objects.create(team=team, hang_after_s=30)
    AttemptActivity.objects.create(attempt=attempt, moved_at=ago(31), stepped_at=ago(31))
    assert watch_activity(NOW).hung == []  # the runner was asked: its dumps may be on their way
    assert watch_activity(NOW + dt.timedelta(seconds=5)).hung == [job.pk]


def test_a_rank_still_moving_while_another_waits_is_named(running, team):
    job, attempt = running
    Job.objects.filter(pk=job.pk).update(nodes=2)
    attempt.nodes = 2
    attempt.save()
    ActivityPolicy.objects.create(team=team, hang_after_s=30)
    AttemptActivity.objects.create(
        attempt=attempt, stepped_at=ago(60), dumps_at=ago(1),
        ranks_moved={"0": ago(2).timestamp(), "1": ago(60).timestamp()},
    )  # fmt: skip
    assert watch_activity(NOW).hung == [job.pk]
    (event,) = JobEvent.objects.filter(job=job, reason__startswith="suspected hang")
    assert event.data["moving_ranks"] == [0] and "rank(s) 0 still progressing" in event.reason


def test_the_jobs_list_shows_each_jobs_efficiency(team, alice):
    # Up 100 s before the page renders (not before NOW: this module's clock was read at import).
    job = queued_job(team, alice)
    started = timezone.now() - dt.timedelta(seconds=100)
    attempt = with_attempt(job, JobStatus.RUNNING, start_time=started)
    AttemptActivity.objects.create(attempt=attempt, active_gpu_us=25 * 10**6)  # of 100 s billed
    page = signed_in(alice).get("/").content.decode()
    assert "Efficiency</th>" in page
    # 25 GPU-s active of the 100 s billed, a little more by the time the page renders
    assert re.search(r'<td class="efficiency mono">2[0-5] %</td>', page), page


def test_a_runner_that_never_reports_does_not_escape_the_policy(running, team):
    job, _ = running  # started 100 s ago; no activity row at all: its runner said nothing
    ActivityPolicy.objects.create(team=team, idle_after_s=30, hang_after_s=60)
    result = watch_activity(NOW)
    assert result.warned == [job.pk] and result.hung == [job.pk]
    (hang,) = JobEvent.objects.filter(job=job, reason__startswith="suspected hang")
    assert hang.data["dumps"] == []  # none came; the page says so
