"""Ticks take turns, and on the embedded ledger a tick holds the database's write lock only
while it writes: a submit commits while a tick reads the queue and decides (jobs.loops.scheduler
`_turn`). Run on the embedded SQLite ledger (a file, as `make test`'s SQLite run has it) and on
PostgreSQL."""

import threading

import pytest
from django.db import connection, connections, transaction

from jobs.loops import scheduler
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Job
from jobs.states import JobStatus
from starforge.db.sqlite3.base import turn
from tests.jobs.factories import queued_job
from tests.jobs.test_scheduler_concurrency import race_two_schedulers

pytestmark = pytest.mark.django_db(transaction=True)
S = JobStatus


@pytest.fixture(autouse=True)
def _shared_database():
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.skip("threads share the embedded ledger only in a file (SF_SQLITE_TEST_DB)")


def test_a_submit_commits_while_a_tick_decides(make_team, make_user, monkeypatch):
    team = make_team("vision", gpu_quota=2)
    user = make_user("ada", team)
    for _ in range(5):
        queued_job(team, user)
    decide = scheduler._decide
    submit_seen: dict[str, object] = {}
    threads = []

    def submit():
        try:
            with transaction.atomic():  # as a submit's: the write lock first, on SQLite
                submit_seen["job"] = queued_job(team, user).pk
        finally:
            connections.close_all()

    def deciding(*args):
        thread = threading.Thread(target=submit)
        threads.append(thread)
        thread.start()
        thread.join(timeout=5)
        submit_seen["while_deciding"] = not thread.is_alive()
        return decide(*args)

    monkeypatch.setattr(scheduler, "_decide", deciding)
    result = admit_queued_jobs()
    threads[0].join()
    assert submit_seen["while_deciding"] is True, "the submit waited for the tick"
    assert len(result.admitted) == 2  # the quota's two GPUs
    # The tick had read the queue before that job was submitted: it waits for the next one.
    assert Job.objects.get(pk=submit_seen["job"]).status == S.QUEUED
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
        pytest.skip("PostgreSQL's race is tests/jobs/test_scheduler_concurrency.py")
    samples = race_two_schedulers(make_team, make_user, {"a": 3, "b": 5, "c": 2}, jobs_per_team=30)
    assert len(samples) > 10
