"""Quotas an admin sets: slots, per-member cap, max GPUs per job, monthly budget (and its hard
stop), cluster shares, priority limits; fair share between teams; the window pause policy.

Every wait is explained with the numbers, and a changed quota counts at the next tick.
"""

import datetime as dt
from decimal import Decimal

import pytest

from jobs.actions import control
from jobs.actions.submit import submit_job
from jobs.errors import BadRequest, Forbidden
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, ClusterShare, Job, JobEvent, ScheduleWindow
from jobs.schemas import JobIn
from jobs.states import JobStatus
from metering.records import meter_ended
from tests.factories import place, queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus
MONDAY_NOON = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def nlp(make_team, noop_cluster):
    return make_team("nlp", gpu_quota=16, cluster=noop_cluster)


def status_of(job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.status, job.status_reason


def test_slots_keep_the_next_job_queued_with_the_count(nlp, make_user):
    nlp.max_jobs = 2
    nlp.save()
    ann = make_user("ann", nlp)
    jobs = [queued_job(nlp, ann, total_gpus=0) for _ in range(3)]
    admit_queued_jobs()
    assert status_of(jobs[2]) == (
        S.QUEUED,
        "waiting for a slot: team nlp runs 2 of the 2 jobs it may run at once",
    )


def test_quota_wait_reads_like_the_issue_example(nlp, make_user):
    ann = make_user("ann", nlp)
    queued_job(nlp, ann, total_gpus=14)
    admit_queued_jobs()
    waiting = queued_job(nlp, ann, total_gpus=4)
    admit_queued_jobs()
    assert status_of(waiting) == (
        S.QUEUED,
        "waiting for quota: team nlp uses 14 of 16 GPUs; this job needs 4",
    )


def test_a_member_cap_holds_one_member_and_lets_another_through(nlp, make_user):
    nlp.user_gpu_cap = 4
    nlp.save()
    ann, ben = make_user("ann", nlp), make_user("ben", nlp)
    queued_job(nlp, ann, total_gpus=3)
    second = queued_job(nlp, ann, total_gpus=2)
    bens = queued_job(nlp, ben, total_gpus=2)
    admit_queued_jobs()
    assert status_of(second) == (
        S.QUEUED,
        "waiting for quota: ann uses 3 of the 4 GPUs team nlp allows one member; this job needs 2",
    )
    assert status_of(bens)[0] == S.SUBMITTED


def test_max_gpus_per_job_is_refused_at_submit_and_holds_jobs_submitted_before(nlp, make_user):
    ann = make_user("ann", nlp)
    before = queued_job(nlp, ann, total_gpus=8)
    nlp.max_gpus_per_job = 4
    nlp.save()
    with pytest.raises(BadRequest, match="team nlp allows at most 4 per job"):
        submit_job(ann, JobIn(entrypoint=["true"], gpus=8))
    admit_queued_jobs()
    assert status_of(before) == (
        S.QUEUED,
        "waiting for quota: team nlp allows at most 4 GPUs per job; this job needs 8",
    )


def test_an_admin_change_counts_at_the_next_tick(nlp, make_user):
    nlp.max_jobs = 1
    nlp.save()
    ann = make_user("ann", nlp)
    first, second = queued_job(nlp, ann), queued_job(nlp, ann)
    admit_queued_jobs()
    assert status_of(second)[0] == S.QUEUED
    nlp.max_jobs = 2
    nlp.save()
    admit_queued_jobs()
    assert status_of(first)[0] == status_of(second)[0] == S.SUBMITTED


def test_a_cluster_share_caps_the_team_on_that_cluster(nlp, make_user, noop_cluster):
    ClusterShare.objects.create(cluster=noop_cluster, team=nlp, percent=1)  # 1% of 1000 = 10
    ann = make_user("ann", nlp)
    queued_job(nlp, ann, total_gpus=8)
    over = queued_job(nlp, ann, total_gpus=4)
    admit_queued_jobs()
    assert status_of(over) == (
        S.QUEUED,
        "waiting for share: team nlp holds 8 of its 10 virtual GPU slots on cluster bench "
        "(1% of 1000); this job needs 4",
    )


def ran(job, start: dt.datetime, hours: float, total_gpus: int) -> None:
    with_attempt(job, S.SUCCEEDED, start_time=start, end_time=start + dt.timedelta(hours=hours))
    Attempt.objects.filter(job=job).update(total_gpus=total_gpus)


def test_a_used_up_budget_keeps_gpu_jobs_queued_until_next_month(nlp, make_user):
    nlp.gpu_hours_per_month = Decimal("10")
    nlp.save()
    ann = make_user("ann", nlp)
    ran(queued_job(nlp, ann, total_gpus=2), MONDAY_NOON - dt.timedelta(hours=6), 5, total_gpus=2)
    meter_ended()
    gpu_job, cpu_job = queued_job(nlp, ann, total_gpus=1), queued_job(nlp, ann, total_gpus=0)
    admit_queued_jobs(MONDAY_NOON)
    assert status_of(gpu_job) == (
        S.QUEUED,
        "waiting for budget: team nlp used 10.0 of its 10.00 GPU-hours this month; "
        "the budget renews Dec 1 00:00 UTC",
    )
    assert status_of(cpu_job)[0] == S.SUBMITTED  # GPU-hours are what the budget counts
    admit_queued_jobs(dt.datetime(2026, 12, 1, 0, 1, tzinfo=dt.UTC))
    assert status_of(gpu_job)[0] == S.SUBMITTED


def test_running_time_counts_toward_the_budget_live(nlp, make_user):
    nlp.gpu_hours_per_month = Decimal("1")
    nlp.save()
    ann = make_user("ann", nlp)
    running = queued_job(nlp, ann, total_gpus=2)
    with_attempt(running, S.RUNNING, start_time=MONDAY_NOON - dt.timedelta(minutes=31))
    waiting = queued_job(nlp, ann, total_gpus=1)
    admit_queued_jobs(MONDAY_NOON)
    assert status_of(waiting)[1].startswith("waiting for budget: team nlp used 1.0 of its 1.00")
    assert status_of(running)[0] == S.RUNNING  # no hard stop asked for: it runs on


def test_a_hard_stop_stops_the_running_gpu_jobs(nlp, make_user):
    nlp.gpu_hours_per_month = Decimal("1")
    nlp.budget_hard_stop = True
    nlp.save()
    ann = make_user("ann", nlp)
    running = queued_job(nlp, ann, total_gpus=2)
    attempt = with_attempt(running, S.RUNNING, start_time=MONDAY_NOON - dt.timedelta(hours=1))
    cpu_only = queued_job(nlp, ann, total_gpus=0)
    with_attempt(cpu_only, S.RUNNING, start_time=MONDAY_NOON - dt.timedelta(hours=1))
    result = admit_queued_jobs(MONDAY_NOON)
    assert result.stopped == [running.pk]
    assert status_of(running) == (
        S.STOPPED,
        "stopped: team nlp used its monthly budget of 1.00 GPU-hours (hard stop)",
    )
    attempt.refresh_from_db()
    assert attempt.end_time is not None
    assert status_of(cpu_only)[0] == S.RUNNING


def test_fair_share_offers_the_scarce_gpus_to_the_team_that_used_less(
    make_team, make_user, local_cluster
):
    # The local cluster has 4 GPU slots; both teams want all of them.
    heavy, light = make_team("heavy", gpu_quota=8), make_team("light", gpu_quota=8)
    hal, lou = make_user("hal", heavy), make_user("lou", light)
    ran(queued_job(heavy, hal, total_gpus=4), MONDAY_NOON - dt.timedelta(days=2), 10, total_gpus=4)
    ran(queued_job(light, lou, total_gpus=4), MONDAY_NOON - dt.timedelta(days=2), 1, total_gpus=4)
    meter_ended()
    heavy_jobs = [queued_job(heavy, hal, total_gpus=1, priority=50) for _ in range(4)]
    light_jobs = [queued_job(light, lou, total_gpus=1) for _ in range(4)]
    admit_queued_jobs(MONDAY_NOON)
    admitted = lambda jobs: sum(status_of(j)[0] == S.SUBMITTED for j in jobs)  # noqa: E731
    # light used 4 GPU-hours (0.5 per GPU of quota), heavy 40 (5 per GPU): light goes first,
    # and heavy's priority 50 does not jump another team's queue.
    assert (admitted(light_jobs), admitted(heavy_jobs)) == (4, 0)


def test_fair_share_alternates_between_teams_with_equal_use(make_team, make_user):
    one, two = make_team("one", gpu_quota=8), make_team("two", gpu_quota=8)
    a, b = make_user("a", one), make_user("b", two)
    ones = [queued_job(one, a, total_gpus=1) for _ in range(4)]
    twos = [queued_job(two, b, total_gpus=1) for _ in range(4)]
    admit_queued_jobs(MONDAY_NOON)
    admitted = [sum(status_of(j)[0] == S.SUBMITTED for j in jobs) for jobs in (ones, twos)]
    assert admitted == [2, 2]


def test_members_priority_is_bounded_and_team_admins_are_not(nlp, make_user):
    ann, boss = make_user("ann", nlp), make_user("boss", nlp, role="admin")
    with pytest.raises(Forbidden, match="priority 50 is above 10, the highest a member"):
        submit_job(ann, JobIn(entrypoint=["true"], gpus=0, priority=50))
    assert submit_job(ann, JobIn(entrypoint=["true"], gpus=0, priority=10))
    assert submit_job(ann, JobIn(entrypoint=["true"], gpus=0, priority=-100))
    assert submit_job(boss, JobIn(entrypoint=["true"], gpus=0, priority=100)).priority


@pytest.fixture
def nights(db):
    # Open Mon-Fri 20:00-08:00 UTC and at weekends.
    return ScheduleWindow.objects.create(name="nights", spec="mon-fri 20:00-08:00, sat-sun")


def test_window_policy_pause_needs_a_window(nlp, make_user):
    ann = make_user("ann", nlp)
    with pytest.raises(BadRequest, match="--window-policy pause needs a window"):
        submit_job(ann, JobIn(entrypoint=["true"], window_policy="pause"))


def test_a_pause_policy_job_pauses_when_its_window_closes_and_resumes_when_it_opens(
    nlp, make_user, nights
):
    ann = make_user("ann", nlp)
    job = submit_job(
        ann, JobIn(entrypoint=["true"], gpus=1, window="nights", window_policy="pause")
    )
    monday_night = dt.datetime(2026, 11, 30, 21, 0, tzinfo=dt.UTC)
    admit_queued_jobs(monday_night)
    place(job, S.RUNNING)
    result = admit_queued_jobs(dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.UTC))
    assert result.paused == [job.pk]
    assert status_of(job) == (
        S.PAUSED,
        "paused: window nights closed; the job resumes when it opens (Tue 20:00 UTC)",
    )
    assert Attempt.objects.get(job=job).end_time is not None
    admit_queued_jobs(dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC))
    assert status_of(job)[0] == S.PAUSED  # still closed: nothing moves
    result = admit_queued_jobs(dt.datetime(2026, 12, 1, 20, 0, tzinfo=dt.UTC))
    assert result.resumed == [job.pk]
    job.refresh_from_db()
    assert (job.status, job.attempt_count) == (S.SUBMITTED, 2)  # resumed and admitted
    reasons = list(JobEvent.objects.filter(job=job).values_list("to_status", "actor"))
    assert (S.PAUSED, "scheduler") in reasons and (S.QUEUED, "scheduler") in reasons


def test_a_person_pausing_a_window_job_keeps_it_paused(nlp, make_user, nights):
    ann = make_user("ann", nlp)
    job = submit_job(
        ann, JobIn(entrypoint=["true"], gpus=1, window="nights", window_policy="pause")
    )
    admit_queued_jobs(dt.datetime(2026, 11, 30, 21, 0, tzinfo=dt.UTC))
    control.pause_job(ann, job.pk)
    admit_queued_jobs(dt.datetime(2026, 11, 30, 22, 0, tzinfo=dt.UTC))
    assert status_of(job)[0] == S.PAUSED
    assert Job.objects.get(pk=job.pk).paused_by_window is False


def test_a_wait_policy_job_runs_on_after_its_window_closes(nlp, make_user, nights):
    ann = make_user("ann", nlp)
    job = submit_job(ann, JobIn(entrypoint=["true"], gpus=1, window="nights"))
    admit_queued_jobs(dt.datetime(2026, 11, 30, 21, 0, tzinfo=dt.UTC))
    place(job, S.RUNNING)
    admit_queued_jobs(dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.UTC))
    assert status_of(job)[0] == S.RUNNING


def test_a_cluster_window_applies_to_every_job_on_it(nlp, make_user, nights, noop_cluster):
    noop_cluster.window = nights
    noop_cluster.save()
    ann = make_user("ann", nlp)
    job = queued_job(nlp, ann)
    admit_queued_jobs(MONDAY_NOON)
    assert status_of(job) == (S.QUEUED, "waiting for window nights (opens Mon 20:00 UTC)")


def test_the_api_refuses_an_unknown_window_policy(nlp, make_user, api_as):
    answer = api_as(make_user("ann", nlp)).post(
        "/jobs", {"entrypoint": ["true"], "window_policy": "sometimes"}
    )
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith("window_policy: ")


def test_the_admin_shows_quotas_shares_and_usage_records(nlp, noop_cluster, client):
    from django.contrib.auth.models import User

    ClusterShare.objects.create(cluster=noop_cluster, team=nlp, percent=50)
    client.force_login(User.objects.create_superuser("root", password="pw"))
    team_page = client.get(f"/admin/jobs/team/{nlp.pk}/change/")
    assert team_page.status_code == 200
    assert b"Quotas (take effect at the scheduler" in team_page.content
    assert b"gpu_hours_per_month" in team_page.content and b"shares-0-percent" in team_page.content
    assert client.get("/admin/jobs/team/").status_code == 200
    assert client.get("/admin/metering/usagerecord/").status_code == 200
