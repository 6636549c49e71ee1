"""The loops write many jobs in batches on the embedded ledger, so a submit commits between two
batches instead of waiting for them all (jobs.ledger.batches). Run on the embedded SQLite ledger
(a file, as `make test`'s SQLite run has it), where a write transaction holds the database's
write lock, and on PostgreSQL, where a submit never waits for a loop's writes of other rows."""

from collections.abc import Iterator, Sequence

import pytest
from django.db import connection

from jobs.ledger import batches
from jobs.ledger.batches import WRITE_BATCH, write_batches
from jobs.loops import launcher, scheduler
from jobs.loops.launcher import launch_attempts
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job, JobEvent
from jobs.states import JobStatus
from tests.factories import SubmitMeanwhile, queued_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("shared_ledger")]
S = JobStatus
JOBS = 2 * WRITE_BATCH + 5  # three batches on the embedded ledger


@pytest.fixture
def team(make_team, noop_cluster):
    return make_team("vision", gpu_quota=100, cluster=noop_cluster)


@pytest.fixture
def user(make_user, team):
    return make_user("ada", team)


def test_batches_are_small_on_the_embedded_ledger_and_one_on_postgresql():
    items = list(range(JOBS))
    sizes = [len(batch) for batch in write_batches(items)]
    if connection.vendor == "sqlite":
        assert sizes == [WRITE_BATCH, WRITE_BATCH, 5]
    else:
        assert sizes == [JOBS]
    assert list(write_batches([])) == []


class SubmitsBetweenBatches:
    """`write_batches` for a loop's module: before each batch after the first, a submit from
    another thread (SubmitMeanwhile), which must commit within 5 s."""

    def __init__(self, team, user) -> None:
        self.team, self.user = team, user
        self.submits: list[SubmitMeanwhile] = []
        self.batch_sizes: list[int] = []

    def __call__(self, items: Sequence) -> Iterator[Sequence]:
        for number, batch in enumerate(batches.write_batches(items)):
            if number:
                self.submits.append(SubmitMeanwhile(self.team, self.user, total_gpus=0))
            self.batch_sizes.append(len(batch))
            yield batch

    @property
    def committed(self) -> list[bool]:
        return [submit.committed for submit in self.submits]

    def join(self) -> None:
        for submit in self.submits:
            submit.join()


def test_a_submit_commits_between_a_ticks_admission_batches(team, user, monkeypatch):
    for _ in range(JOBS):
        queued_job(team, user)
    between = SubmitsBetweenBatches(team, user)
    monkeypatch.setattr(scheduler, "write_batches", between)
    result = admit_queued_jobs()
    between.join()
    assert len(result.admitted) == JOBS  # every job the tick decided on, whatever the batches
    if connection.vendor == "sqlite":
        assert between.batch_sizes == [WRITE_BATCH, WRITE_BATCH, 5]
        assert between.committed == [True, True], "a submit waited for the whole admission"
    assert Job.objects.filter(status=S.SUBMITTED).count() == JOBS
    # Each admitted job has its attempt and its event, whichever batch wrote it.
    admitted = Job.objects.filter(status=S.SUBMITTED)
    assert all(job.current_attempt_id is not None for job in admitted)
    assert JobEvent.objects.filter(to_status=S.SUBMITTED).count() == JOBS
    # The jobs submitted meanwhile were not in the tick's queue: they wait for the next one.
    assert Job.objects.filter(status=S.QUEUED).count() == len(between.submits)


def test_a_submit_commits_between_a_launchers_record_batches(team, user, monkeypatch):
    for _ in range(JOBS):
        queued_job(team, user)
    attempts = admit_queued_jobs().admitted
    between = SubmitsBetweenBatches(team, user)
    monkeypatch.setattr(launcher, "RECORD_EVERY", JOBS)  # one record of every launch
    monkeypatch.setattr(launcher, "RECORD_AFTER_S", 60)
    monkeypatch.setattr(launcher, "write_batches", between)
    outcomes = launch_attempts(attempts)
    between.join()
    assert sorted(o.attempt_id for o in outcomes if o.job_ref) == sorted(attempts)
    if connection.vendor == "sqlite":
        assert between.batch_sizes == [WRITE_BATCH, WRITE_BATCH, 5]
        assert between.committed == [True, True], "a submit waited for the whole record"
    assert Job.objects.filter(status=S.PENDING).count() == JOBS
    assert Attempt.objects.filter(pk__in=attempts, job_ref="").count() == 0
