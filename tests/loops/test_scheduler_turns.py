"""Ticks take turns, and on the embedded ledger a tick holds the database's write lock only
while it writes: a submit commits while a tick reads the queue and decides (jobs.loops.scheduler
`_turn`). Run on the embedded SQLite ledger (a file, as `make test`'s SQLite run has it) and on
PostgreSQL."""

import pytest
from django.db import connection

from jobs.loops import scheduler
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Job
from jobs.states import JobStatus
from starforge.db.sqlite3.base import turn
from tests.factories import SubmitMeanwhile, queued_job
from tests.loops.racing import race_two_schedulers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("shared_ledger")]
S = JobStatus


def test_a_submit_commits_while_a_tick_decides(make_team, make_user, monkeypatch):
    team = make_team("vision", gpu_quota=2)
    user = make_user("ada", team)
    for _ in range(5):
        queued_job(team, user)
    decide = scheduler.decide
    submits: list[SubmitMeanwhile] = []

    def deciding(*args):
        submits.append(SubmitMeanwhile(team, user))
        return decide(*args)

    monkeypatch.setattr(scheduler, "decide", deciding)
    result = admit_queued_jobs()
    submits[0].join()
    assert submits[0].committed is True, "the submit waited for the tick"
    assert len(result.admitted) == 2  # the quota's two GPUs
    # The tick had read the queue before that job was submitted: it waits for the next one.
    assert Job.objects.get(pk=submits[0].job_id).status == S.QUEUED
    assert Job.objects.filter(status=S.QUEUED).count() == 4


def test_a_tick_skips_while_another_has_the_turn(make_team, make_user):
    team = make_team("vision", gpu_quota=4)
    user = make_user("ada", team)
    queued_job(team, user)
    if connection.vendor == "sqlite":
        with turn("scheduler") as mine:
            assert mine is True
            assert admit_queued_jobs().skipped
            with turn("scheduler") as again:
                assert again is False  # not reentrant: another caller waits for its turn
    result = admit_queued_jobs()
    assert not result.skipped
    assert len(result.admitted) == 1


def test_two_schedulers_on_the_embedded_ledger_never_exceed_any_quota(make_team, make_user):
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's race is tests/loops/test_scheduler_concurrency.py")
    samples = race_two_schedulers(make_team, make_user, {"a": 3, "b": 5, "c": 2}, jobs_per_team=30)
    assert len(samples) > 10
