"""/metrics: each team's active and idle GPU-seconds this month, from the usage records of
ended attempts and the counters of running ones (metering.activity)."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.api.prometheus import render
from jobs.models import AttemptActivity
from metering.records import meter_ended
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def gauge(text: str, name: str, team: str) -> float:
    prefix = f'{name}{{team="{team}"}} '
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line.removeprefix(prefix))


def test_active_and_idle_gpu_seconds_this_month_by_team(team, alice, make_team):
    make_team("nlp")
    start = NOW - dt.timedelta(seconds=60)
    done = with_attempt(
        queued_job(team, alice, total_gpus=2), "SUCCEEDED", start_time=start, end_time=NOW
    )
    AttemptActivity.objects.create(attempt=done, active_gpu_us=90 * 10**6, idle_gpu_us=30 * 10**6)
    meter_ended()
    running = with_attempt(queued_job(team, alice), "RUNNING", start_time=start)
    AttemptActivity.objects.create(attempt=running, active_gpu_us=5 * 10**6, idle_gpu_us=10**6)
    text = render(NOW)
    assert gauge(text, "starforge_active_gpu_seconds_month", "vision") == pytest.approx(95)
    assert gauge(text, "starforge_idle_gpu_seconds_month", "vision") == pytest.approx(31)
    assert gauge(text, "starforge_active_gpu_seconds_month", "nlp") == 0
