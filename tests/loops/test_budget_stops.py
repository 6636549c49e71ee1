"""`jobs.loops.budgets.apply_budget_stops`, the tick's hard-stop step, called on its own: a team
that used its monthly budget and asked for a hard stop has its running GPU jobs stopped, and the
step says which; on a fixed clock."""

import datetime as dt
from decimal import Decimal

import pytest

from jobs.loops.budgets import apply_budget_stops
from jobs.models import JobEvent
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus
MONDAY_NOON = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
AN_HOUR_AGO = MONDAY_NOON - dt.timedelta(hours=1)


@pytest.fixture
def nlp(make_team, noop_cluster):
    team = make_team("nlp", gpu_quota=16, cluster=noop_cluster)
    team.gpu_hours_per_month, team.budget_hard_stop = Decimal("1"), True
    team.save()
    return team


def running(team, user, total_gpus: int):
    job = queued_job(team, user, total_gpus=total_gpus)
    with_attempt(job, S.RUNNING, start_time=AN_HOUR_AGO)
    return job


def test_a_used_up_budget_stops_the_running_gpu_jobs_and_says_which(nlp, make_user):
    ann = make_user("ann", nlp)
    gpu_job, cpu_job = running(nlp, ann, total_gpus=1), running(nlp, ann, total_gpus=0)
    assert apply_budget_stops(MONDAY_NOON) == [gpu_job.pk]
    gpu_job.refresh_from_db()
    assert (gpu_job.status, gpu_job.status_reason) == (
        S.STOPPED,
        "stopped: team nlp used its monthly budget of 1.00 GPU-hours (hard stop)",
    )
    assert JobEvent.objects.get(job=gpu_job, to_status=S.STOPPED).actor == "scheduler"
    cpu_job.refresh_from_db()
    assert cpu_job.status == S.RUNNING  # GPU-hours are what the budget counts


def test_the_step_stops_nothing_the_second_time(nlp, make_user):
    running(nlp, make_user("ann", nlp), total_gpus=1)
    assert len(apply_budget_stops(MONDAY_NOON)) == 1
    assert apply_budget_stops(MONDAY_NOON) == []


def test_a_budget_with_room_left_or_without_a_hard_stop_stops_nothing(nlp, make_user):
    ann = make_user("ann", nlp)
    job = running(nlp, ann, total_gpus=1)
    assert apply_budget_stops(MONDAY_NOON - dt.timedelta(minutes=30)) == []  # half an hour used
    nlp.budget_hard_stop = False
    nlp.save()
    assert apply_budget_stops(MONDAY_NOON) == []
    job.refresh_from_db()
    assert job.status == S.RUNNING


def test_a_tick_passes_the_teams_and_usage_it_read(nlp, make_user):
    job = running(nlp, make_user("ann", nlp), total_gpus=1)
    teams = {nlp.pk: nlp}
    assert apply_budget_stops(MONDAY_NOON, teams, month_us={}) == []  # as read: none used
    assert apply_budget_stops(MONDAY_NOON, teams, month_us={nlp.pk: 3600 * 10**6}) == [job.pk]
