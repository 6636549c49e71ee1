"""`jobs.ledger.ends`, step by step: an end closes the clocks once, records its cause, walks the
job to its end and runs what follows, the same through each of its doors (an engine's end, a
group of them, the server's own stop or pause). A fixed clock throughout."""

import datetime as dt

import pytest
from django.db import transaction

from jobs.ledger import ends
from jobs.ledger.ends import End
from jobs.ledger.halt import halt
from jobs.ledger.transitions import Moved
from jobs.models import Attempt, Job, JobEvent
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

S = JobStatus
T0 = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
SEC = dt.timedelta(seconds=1)
NOT_CREATED = "follow-on jobs eval were not created: the job ended STOPPED, not SUCCEEDED"


@pytest.fixture
def running(team, alice):
    """A RUNNING job with follow-ons, one retry, its attempt up since T0 (its team's only)."""
    job = queued_job(team, alice, then=["eval"], max_retries=1)
    attempt = with_attempt(job, S.RUNNING, submitted_at=T0 - 60 * SEC, start_time=T0)
    return Attempt.objects.select_related("job").get(pk=attempt.pk)


def notes(job_id: int) -> list[str]:
    return list(
        JobEvent.objects.filter(job_id=job_id, kind=JobEvent.Kind.NOTE)
        .order_by("id")
        .values_list("reason", flat=True)
    )


def path(job_id: int) -> list[str]:
    return list(
        JobEvent.objects.filter(job_id=job_id, kind=JobEvent.Kind.STATUS)
        .order_by("id")
        .values_list("to_status", flat=True)
    )


@pytest.mark.django_db
def test_a_failure_closes_the_clocks_once_records_its_cause_and_plans_the_retry(running):
    end = End(S.FAILED, "exited with code 3", at=T0 + 90 * SEC, exit_code=3, failure="exit")
    assert ends.end_attempt(running, end, T0 + 95 * SEC)
    assert not ends.end_attempt(running, end, T0 + 99 * SEC)  # seen again: nothing more
    attempt = Attempt.objects.get(pk=running.pk)
    assert (attempt.end_time, attempt.exit_code, attempt.failure, attempt.end_reason) == (
        T0 + 90 * SEC,
        3,
        "exit",
        "exited with code 3",
    )
    job = Job.objects.get(pk=running.job_id)
    assert job.status == S.FAILED and job.next_attempt_at is not None
    assert path(job.pk) == [S.FAILED]
    assert [n.split(" at ")[0] for n in notes(job.pk)] == ["automatic retry 1 of 1"]


@pytest.mark.django_db
def test_an_end_walks_the_job_through_the_states_it_had_not_reached(team, alice):
    job = queued_job(team, alice)
    attempt = with_attempt(job, S.SUBMITTED, submitted_at=T0)
    attempt = Attempt.objects.select_related("job").get(pk=attempt.pk)
    end = End(S.SUCCEEDED, "exited with code 0", at=T0 + 9 * SEC, started=T0 + 2 * SEC)
    ends.end_attempt(attempt, end, T0 + 10 * SEC)
    assert path(job.pk) == [S.PENDING, S.RUNNING, S.SUCCEEDED]
    attempt.refresh_from_db()
    assert (attempt.start_time, attempt.end_time) == (T0 + 2 * SEC, T0 + 9 * SEC)


@pytest.mark.django_db
def test_a_success_nobody_saw_start_is_billed_nothing_and_says_so(team, alice):
    job = queued_job(team, alice)
    attempt = with_attempt(job, S.PENDING, submitted_at=T0)
    attempt = Attempt.objects.select_related("job").get(pk=attempt.pk)
    ends.end_attempt(attempt, End(S.SUCCEEDED, "exited with code 0", at=T0 + 9 * SEC), T0 + 9 * SEC)
    attempt.refresh_from_db()
    assert attempt.start_time == attempt.end_time == T0 + 9 * SEC
    assert notes(job.pk) == [
        "the backend reported the end but not the start, and the runner's start report did not "
        "arrive: this attempt is billed 0 GPU-seconds"
    ]


@pytest.mark.django_db
def test_an_engines_stop_says_what_a_persons_stop_says_of_the_follow_ons(running, team, alice):
    ends.end_attempt(running, End(S.STOPPED, "backend reported CANCELLED"), T0 + 9 * SEC)
    other = queued_job(team, alice, then=["eval"])
    with_attempt(other, S.RUNNING, submitted_at=T0, start_time=T0)
    halt([other.pk], S.STOPPED, "stopped by alice", actor="alice", now=T0 + 9 * SEC)
    assert notes(running.job_id) == notes(other.pk) == [NOT_CREATED]


@pytest.mark.django_db
def test_a_pause_leaves_the_follow_ons_to_the_resume(running):
    ends.end_attempt(running, End(S.PAUSED, "preempted"), T0 + 9 * SEC)
    assert Job.objects.get(pk=running.job_id).status == S.PAUSED
    assert notes(running.job_id) == []


@pytest.mark.django_db
def test_the_servers_stop_closes_at_its_clock_and_says_once_the_follow_ons_are_not_made(
    running, team, alice
):
    failed = queued_job(team, alice, then=["eval"])
    with_attempt(failed, S.FAILED, submitted_at=T0, end_time=T0)  # its failure said it already
    jobs = list(Job.objects.filter(pk__in=[running.job_id, failed.pk]).order_by("pk"))
    moved, refused = ends.end_decided(jobs, S.STOPPED, "stopped by alice", actor="alice", now=T0)
    assert (moved, refused) == ([running.job_id, failed.pk], [])
    assert Attempt.objects.get(pk=running.pk).end_time == T0
    assert notes(running.job_id) == [NOT_CREATED] and notes(failed.pk) == []


@pytest.mark.django_db
def test_the_servers_end_refused_by_the_table_writes_nothing(team, alice):
    job = queued_job(team, alice)
    attempt = with_attempt(job, S.SUCCEEDED, submitted_at=T0, start_time=T0, end_time=T0)
    job.refresh_from_db()
    moved, refused = ends.end_decided([job], S.STOPPED, "stop", actor="alice", now=T0)
    assert moved == [] and len(refused) == 1
    assert Attempt.objects.get(pk=attempt.pk).end_reason == ""


@pytest.mark.django_db
def test_a_group_ends_as_each_would_alone_or_not_at_all(team, alice):
    attempts = []
    for _ in range(3):
        job = queued_job(team, alice)
        made = with_attempt(job, S.RUNNING, submitted_at=T0, start_time=T0)
        attempts.append(Attempt.objects.select_related("job").get(pk=made.pk))
    reason = "exited with code 0"
    observed = {a.pk: End(S.SUCCEEDED, reason, at=T0 + 5 * SEC, exit_code=0) for a in attempts}
    Attempt.objects.filter(pk=attempts[1].pk).update(end_time=T0)  # closed meanwhile
    with pytest.raises(Moved), transaction.atomic():
        ends.end_group(attempts, observed, T0 + 6 * SEC)
    assert list(Job.objects.values_list("status", flat=True).distinct()) == [S.RUNNING]
    del attempts[1]
    ends.end_group(attempts, {a.pk: observed[a.pk] for a in attempts}, T0 + 6 * SEC)
    for attempt in attempts:
        attempt.refresh_from_db()
        assert attempt.end_time == T0 + 5 * SEC and attempt.end_reason == reason
        assert path(attempt.job_id) == [S.SUCCEEDED]
