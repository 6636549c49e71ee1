"""jobs.ledger.departures on real PostgreSQL: a member's removal racing a scheduler tick never
lets their queued job be admitted as the team's work, and a job the tick admitted first goes on
as the team's, noted."""

import threading

import pytest
from django.db import connection, connections, transaction

from jobs.actions import teams
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job, JobEvent
from jobs.reads.teams import inherited_jobs
from jobs.states import JobStatus as S
from tests.factories import queued_job

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
WAIT_S = 10


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (run by `make test`)")


@pytest.fixture
def members(make_team, make_user, noop_cluster):
    team = make_team("nlp", gpu_quota=4, cluster=noop_cluster)
    return make_user("ann", team, role="admin"), make_user("cal", team)


def test_a_removal_racing_a_tick_leaves_the_job_stopped_and_never_admitted(members):
    ann, cal = members
    job = queued_job(ann_team(ann), cal)
    removed, commit = threading.Event(), threading.Event()

    def remove() -> None:
        try:
            with transaction.atomic():
                teams.remove_member(ann, "nlp", "cal")  # stops the job, row locked till commit
                removed.set()
                commit.wait(WAIT_S)
        finally:
            connections.close_all()

    def tick() -> None:
        try:
            admit_queued_jobs()  # sees cal still a member and the job QUEUED: tries to admit
        finally:
            connections.close_all()

    remover = threading.Thread(target=remove)
    remover.start()
    assert removed.wait(WAIT_S)
    scheduler = threading.Thread(target=tick)
    scheduler.start()
    scheduler.join(1)
    assert scheduler.is_alive()  # waiting for the job's row, which the removal holds
    commit.set()
    remover.join(WAIT_S)
    scheduler.join(WAIT_S)
    job.refresh_from_db()
    assert job.status == S.STOPPED and "no longer a member" in job.status_reason
    assert job.attempt_count == 0 and not Attempt.objects.filter(job=job).exists()


def test_a_job_admitted_before_the_removal_goes_on_as_the_teams_with_a_note(members):
    ann, cal = members
    job = queued_job(ann_team(ann), cal)
    admit_queued_jobs()
    teams.remove_member(ann, "nlp", "cal")
    job.refresh_from_db()
    assert job.status == S.SUBMITTED
    note = JobEvent.objects.get(job=job, kind=JobEvent.Kind.NOTE, actor="membership")
    assert note.reason == (
        "cal is no longer a member of team nlp: this job goes on as the team's work; "
        "a team admin may stop it"
    )
    assert [j.job_id for j in inherited_jobs(ann, "nlp")] == [job.pk]


def test_a_tick_stops_nothing_while_every_submitter_may_submit(members):
    ann, cal = members
    queued_job(ann_team(ann), cal)
    assert admit_queued_jobs().outsiders == []
    assert Job.objects.get().status == S.SUBMITTED


def ann_team(ann):
    return ann.membership_set.get().team
