"""Borrowing idle quota: a team allowed to borrow runs jobs past its quota on a lendable team's
idle GPUs, within its cap; they count against the lender's quota and say so everywhere; the
ledger check accepts them, and two schedulers at once never over-lend (PostgreSQL)."""

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from jobs.ledger.transitions import Change, apply_transitions
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Cluster, Job, ScheduleWindow
from jobs.reads.diagnostics import explain
from jobs.reads.ledgercheck import admissions, quotas_now
from jobs.states import JobStatus
from tests.factories import queued_job
from tests.threads import race

S = JobStatus


@pytest.fixture
def teams(make_team, make_user):
    """Team `lab` (quota 8, lendable) and team `vision` (quota 2, may borrow 4), one member
    each, on a cluster with room for everyone."""
    cluster = Cluster.objects.create(name="big", kind="noop", settings={"gpus": 100})
    lab = make_team("lab", gpu_quota=8, cluster=cluster)
    lab.lendable = True
    lab.save()
    vision = make_team("vision", gpu_quota=2, cluster=cluster)
    vision.borrow_cap = 4
    vision.save()
    return lab, make_user("lea", lab), vision, make_user("vic", vision)


def violations() -> list[str]:
    """What check_ledger says of quotas now and of every admission (the factories' jobs have
    no QUEUED event, so their timelines are not checked here)."""
    now = timezone.now()
    return [*quotas_now(now), *admissions(now)]


def state(job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.status, job.status_reason


def lender_of(job) -> str | None:
    attempt = Attempt.objects.filter(job=job).select_related("borrowed_from").first()
    return attempt.borrowed_from.name if attempt and attempt.borrowed_from else None


@pytest.mark.django_db
def test_past_its_quota_a_team_borrows_idle_gpus_within_its_cap(teams):
    lab, _, vision, vic = teams
    jobs = [queued_job(vision, vic, total_gpus=2) for _ in range(4)]
    admit_queued_jobs()
    assert [state(j)[0] for j in jobs] == [S.SUBMITTED] * 3 + [S.QUEUED]
    assert [lender_of(j) for j in jobs[:3]] == [None, "lab", "lab"]
    assert state(jobs[1])[1] == (
        "admitted on GPUs borrowed from another team's idle quota (preemptible); launching"
    )
    assert state(jobs[3])[1] == (
        "waiting for quota: team vision uses 2 of 2 GPUs; this job needs 2 (it borrows 4 of "
        "the 4 GPUs it may borrow)"
    )
    assert violations() == []


@pytest.mark.django_db
def test_lent_gpus_count_against_the_lenders_quota(teams):
    lab, lea, vision, vic = teams
    for _ in range(3):
        queued_job(vision, vic, total_gpus=2)
    admit_queued_jobs()  # 4 of lab's 8 lent
    mine = queued_job(lab, lea, total_gpus=6)
    admit_queued_jobs()
    assert state(mine) == (  # and takes them back once they have run their minimum
        S.QUEUED,
        "waiting for lent GPUs: 4 of team lab's 8 GPUs are lent to other teams, and too few "
        "of the jobs on them have run the minimum 10 min before they may be preempted",
    )
    assert violations() == []


@pytest.mark.django_db
def test_a_lender_with_a_gpu_job_of_its_own_waiting_lends_nothing(teams):
    lab, lea, vision, vic = teams
    ScheduleWindow.objects.create(name="never", spec="mon 00:00-00:01")
    waiting = queued_job(lab, lea, total_gpus=1, window=ScheduleWindow.objects.get())
    first, second = queued_job(vision, vic, total_gpus=2), queued_job(vision, vic, total_gpus=2)
    admit_queued_jobs()
    assert state(waiting)[0] == S.QUEUED and state(first)[0] == S.SUBMITTED
    assert state(second) == (
        S.QUEUED,
        "waiting for quota: team vision uses 2 of 2 GPUs; this job needs 2 (no lendable team "
        "has that many idle GPUs)",
    )


@pytest.mark.django_db
def test_no_team_lends_unless_marked_lendable_and_none_borrows_without_a_cap(teams, make_team):
    lab, _, vision, vic = teams
    lab.lendable = False
    lab.save()
    first, second = queued_job(vision, vic, total_gpus=2), queued_job(vision, vic, total_gpus=2)
    admit_queued_jobs()
    assert [state(j)[0] for j in (first, second)] == [S.SUBMITTED, S.QUEUED]
    lab.lendable, vision.borrow_cap = True, None
    lab.save()
    vision.save()
    admit_queued_jobs()
    assert state(second) == (
        S.QUEUED,
        "waiting for quota: team vision uses 2 of 2 GPUs; this job needs 2",
    )


@pytest.mark.django_db
def test_a_borrowed_job_says_so_in_the_api_diagnostics_and_the_list(teams, api_as):
    lab, _, vision, vic = teams
    own, borrowed = queued_job(vision, vic, total_gpus=2), queued_job(vision, vic, total_gpus=2)
    admit_queued_jobs()
    api = api_as(vic)
    assert api.get(f"/jobs/{own.pk}").json()["borrowed"] is False
    assert api.get(f"/jobs/{borrowed.pk}").json()["borrowed"] is True
    assert (
        "It runs on GPUs borrowed from another team's idle quota, beyond its own team's: it is "
        "preemptible while it holds them once it has run 10 min, when that team wants them "
        "back (no checkpoint of its seen yet)."
    ) in explain(Job.objects.get(pk=borrowed.pk))
    console = Client()
    console.force_login(vic)
    page = console.get("/").content.decode()
    assert page.count('<span class="badge borrowed"') == 1
    # Once it ends it holds nothing borrowed any more.
    apply_transitions(S.STOPPED, [Change(borrowed.pk, "test")], actor="test")
    assert api.get(f"/jobs/{borrowed.pk}").json()["borrowed"] is False


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_schedulers_at_once_never_over_lend_or_over_borrow(make_team, make_user):
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (run by `make test`)")
    cluster = Cluster.objects.create(name="big", kind="noop", settings={"gpus": 1000})
    lenders = [make_team(f"lend{i}", gpu_quota=4, cluster=cluster) for i in range(2)]
    for team in lenders:
        team.lendable = True
        team.save()
    borrowers = [make_team(f"borrow{i}", gpu_quota=1, cluster=cluster) for i in range(3)]
    for team in borrowers:
        team.borrow_cap = 3
        team.save()
        user = make_user(f"u-{team.name}", team)
        for _ in range(40):
            queued_job(team, user, total_gpus=1)
    found: list[str] = []

    def check():
        found.extend(violations())

    def churn():
        active = list(Job.objects.filter(status=S.SUBMITTED).values_list("pk", flat=True)[:3])
        apply_transitions(S.STOPPED, [Change(pk, "test churn") for pk in active], actor="test")

    steps = [admit_queued_jobs, admit_queued_jobs, churn, check]
    errors = race(steps, lambda: not Job.objects.filter(status=S.QUEUED).exists(), 120)
    assert errors == [] and found == []
    assert violations() == []
    assert Attempt.objects.filter(borrowed_from__isnull=False).count() > 3  # it did lend
