"""The transition function against the whole table: every allowed pair, every refused one."""

import itertools

import pytest

from jobs.ledger.transitions import Change, TransitionRefused, apply_transitions, transition
from jobs.models import Job, JobEvent
from jobs.states import ALLOWED_TRANSITIONS, JobStatus

ALL_PAIRS = list(itertools.product(JobStatus, JobStatus))
ALLOWED = [(a, b) for a, b in ALL_PAIRS if b in ALLOWED_TRANSITIONS[a]]
REFUSED = [(a, b) for a, b in ALL_PAIRS if b not in ALLOWED_TRANSITIONS[a]]


def _job_in(status: JobStatus, team, user) -> Job:
    job = Job.objects.create(
        run_id=f"r{Job.objects.count()}",
        team=team,
        user=user,
        cluster=team.default_cluster,
        entrypoint=["true"],
    )
    Job.objects.filter(pk=job.pk).update(status=status)  # test setup: place the job in a state
    job.refresh_from_db()
    return job


CONTRACT = """QUEUED>SUBMITTED QUEUED>STOPPED QUEUED>PAUSED SUBMITTED>PENDING SUBMITTED>FAILED
SUBMITTED>QUEUED SUBMITTED>STOPPED SUBMITTED>PAUSED PENDING>RUNNING PENDING>FAILED PENDING>STOPPED
PENDING>PAUSED RUNNING>SUCCEEDED RUNNING>FAILED RUNNING>STOPPED RUNNING>PAUSED PAUSED>QUEUED
PAUSED>STOPPED FAILED>QUEUED FAILED>STOPPED STOPPED>QUEUED"""


def test_the_table_is_exactly_the_architecture_contract():
    assert {f"{a}>{b}" for a, b in ALLOWED} == set(CONTRACT.split())


@pytest.mark.django_db
@pytest.mark.parametrize(("current", "target"), ALLOWED)
def test_every_allowed_pair_changes_the_row_and_writes_one_event(current, target, team, alice):
    job = _job_in(current, team, alice)
    changed = transition(job.pk, target, reason="because", actor="tester")
    job.refresh_from_db()
    assert (changed.status, job.status, job.status_reason) == (target, target, "because")
    event = JobEvent.objects.get(job=job)
    assert (event.from_status, event.to_status, event.actor) == (current, target, "tester")


@pytest.mark.django_db
@pytest.mark.parametrize(("current", "target"), REFUSED)
def test_every_other_pair_is_refused_and_changes_nothing(current, target, team, alice):
    job = _job_in(current, team, alice)
    with pytest.raises(TransitionRefused) as refused:
        transition(job.pk, target, reason="nope", actor="tester")
    assert current in str(refused.value)
    job.refresh_from_db()
    assert job.status == current and job.status_reason == ""
    assert not JobEvent.objects.filter(job=job).exists()


@pytest.mark.django_db
def test_expected_states_guard_a_compare_and_swap(team, alice):
    job = _job_in(JobStatus.RUNNING, team, alice)
    with pytest.raises(TransitionRefused, match="needs the job to be PAUSED"):
        transition(job.pk, JobStatus.QUEUED, actor="tester", expected={JobStatus.PAUSED})


@pytest.mark.django_db
def test_batch_changes_only_the_allowed_jobs(team, alice):
    queued = _job_in(JobStatus.QUEUED, team, alice)
    done = _job_in(JobStatus.SUCCEEDED, team, alice)
    changed, refused = apply_transitions(
        JobStatus.STOPPED, [Change(queued.pk, "a"), Change(done.pk, "b")], actor="tester"
    )
    assert [j.pk for j in changed] == [queued.pk]
    assert [r.job_id for r in refused] == [done.pk]
    assert Job.objects.get(pk=done.pk).status == JobStatus.SUCCEEDED
