"""No starvation: the first job of a cluster's order that does not fit gets GPUs reserved, and
smaller jobs pass it only as backfill: when their time limits end before its start, or when it
still has its GPUs at its start; jobs without a time limit may pass it only while it is young
(SF_RESERVE_AGE_S). On a controllable clock."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Cluster, Job
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus


@pytest.fixture
def eight(make_team, make_user):
    """A cluster of 8 GPUs, 6 of them held by a running job until NOW + 100 s, and a team with
    quota to spare; the 8-GPU job BIG waits for them."""
    cluster = Cluster.objects.create(name="eight", kind="noop", settings={"gpus": 8})
    team = make_team("vision", gpu_quota=100, cluster=cluster)
    user = make_user("bob", team)
    now = timezone.now()
    running = queued_job(team, user, total_gpus=6, cluster=cluster, time_limit_s=100)
    with_attempt(running, S.RUNNING, job_ref="r", pending_at=now, start_time=now)
    big = queued_job(team, user, total_gpus=8, cluster=cluster, time_limit_s=3600)
    Job.objects.filter(pk=big.pk).update(status_changed_at=now - dt.timedelta(minutes=30))
    return team, user, cluster, now, big


def small(eight, **fields):
    team, user, cluster, *_ = eight
    return queued_job(team, user, total_gpus=1, cluster=cluster, **fields)


def status(job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.status, job.status_reason


def test_a_small_job_that_ends_before_the_reserved_start_backfills(eight):
    *_, now, big = eight
    quick = small(eight, time_limit_s=60)
    admit_queued_jobs(now=now)
    assert status(big)[0] == S.QUEUED
    assert status(quick)[0] == S.SUBMITTED


def test_a_small_job_that_would_run_past_the_reserved_start_waits_and_says_why(eight):
    *_, now, big = eight
    slow = small(eight, time_limit_s=500)
    admit_queued_jobs(now=now)
    state, reason = status(slow)
    reserved_from = (now + dt.timedelta(seconds=100)).strftime("%Y-%m-%d %H:%M")
    assert state == S.QUEUED
    assert reason == (
        f"waiting for reserved GPUs: cluster eight's GPUs are reserved from {reserved_from} UTC "
        "for a job that waited longer (8 GPUs); this job's time limit would run past that"
    )


def test_a_job_without_a_limit_may_not_pass_a_job_waiting_past_the_age(eight, settings):
    *_, now, big = eight
    settings.SF_RESERVE_AGE_S = 600  # BIG has waited 30 min
    endless = small(eight)
    admit_queued_jobs(now=now)
    state, reason = status(endless)
    assert state == S.QUEUED and "may not pass a job that has waited more than 10 min" in reason


def test_a_job_without_a_limit_may_pass_a_young_reservation(eight, settings):
    *_, now, big = eight
    settings.SF_RESERVE_AGE_S = 3600  # BIG has waited 30 min only
    endless = small(eight)
    admit_queued_jobs(now=now)
    assert status(endless)[0] == S.SUBMITTED and status(big)[0] == S.QUEUED


def test_gpus_the_reserved_job_does_not_need_are_free_for_anyone(make_team, make_user):
    cluster = Cluster.objects.create(name="ten", kind="noop", settings={"gpus": 10})
    team = make_team("vision", gpu_quota=100, cluster=cluster)
    user = make_user("bob", team)
    now = timezone.now()
    running = queued_job(team, user, total_gpus=8, cluster=cluster, time_limit_s=100)
    with_attempt(running, S.RUNNING, job_ref="r", pending_at=now, start_time=now)
    big = queued_job(team, user, total_gpus=9, cluster=cluster)
    Job.objects.filter(pk=big.pk).update(status_changed_at=now - dt.timedelta(hours=2))
    # At +100 s ten are free and BIG needs nine: one job of one GPU, for good, leaves it room;
    # a second, for good as well, would not. A third that ends before +100 s takes the last.
    first, second = (queued_job(team, user, total_gpus=1, cluster=cluster) for _ in range(2))
    third = queued_job(team, user, total_gpus=1, cluster=cluster, time_limit_s=50)
    admit_queued_jobs(now=now)
    assert [status(j)[0] for j in (big, first, second, third)] == [
        S.QUEUED,
        S.SUBMITTED,
        S.QUEUED,
        S.SUBMITTED,
    ]
    assert status(second)[1].startswith("waiting for reserved GPUs: cluster ten's GPUs")


def test_the_reserved_job_starts_when_its_gpus_come_back(eight):
    *_, now, big = eight
    quick = small(eight, time_limit_s=60)
    admit_queued_jobs(now=now)
    Job.objects.filter(status__in=S.active()).update(status=S.SUCCEEDED)  # all ended
    admit_queued_jobs(now=now + dt.timedelta(seconds=101))
    assert status(big)[0] == S.SUBMITTED and status(quick)[0] == S.SUCCEEDED
