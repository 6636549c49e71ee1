"""Taking lent GPUs back: when a lendable team's job waits for GPUs its quota lent out, the
scheduler preempts borrowers (lowest priority, then most recent checkpoint, then most recent
start; never one that has run less than the minimum runtime), each gets a notice and keeps its
GPUs until it ends, then goes PAUSED ("preempted: borrowed GPUs returned to the lending team")
and is queued again
without spending its retry budget. A controllable clock throughout; the engine is a fake that
records what it was told (the real ones: the end-to-end tests)."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.executors.base import Observation, override
from jobs.loops.reconciler import reconcile_all
from jobs.models import Attempt, Cluster, Job, JobEvent
from jobs.reads.diagnostics import explain
from jobs.reads.ledgercheck import admissions, quotas_now
from jobs.reads.preemption import paused_jobs
from jobs.states import JobStatus
from metering.records import meter_ended
from tests.factories import queued_job
from tests.loops.borrowers import MIN, T0, Engine, ends, run_borrowers, tick

S = JobStatus


@pytest.fixture
def engine(db):
    Engine.notices, Engine.cancels, Engine.ends, Engine.gone = [], [], {}, set()
    cluster = Cluster.objects.create(name="gpu", kind="noop", settings={"preempt_grace_s": 90})
    with override(None, Engine):
        yield cluster


@pytest.fixture
def teams(engine, make_team, make_user):
    """Team `lab` (quota 8, lendable) and team `vision` (quota 0, may borrow 8)."""
    lab = make_team("lab", gpu_quota=8, cluster=engine)
    lab.lendable = True
    lab.save()
    vision = make_team("vision", gpu_quota=0, cluster=engine)
    vision.borrow_cap = 8
    vision.save()
    return lab, make_user("lea", lab), vision, make_user("vic", vision)


def preempted_borrower(teams, capture) -> Job:
    """A borrower of all 8 of lab's GPUs, up for an hour, preempted at T0 for lab's job."""
    lab, lea, vision, vic = teams
    (victim,) = run_borrowers(vision, vic, capture, (8, 0, T0 - 60 * MIN, None))
    queued_job(lab, lea, total_gpus=8)
    tick(T0, capture)
    return victim


def preempted(*jobs) -> list[bool]:
    return [Attempt.objects.get(pk=j.current_attempt_id).preempted_at is not None for j in jobs]


def reason(job) -> str:
    job.refresh_from_db()
    return job.status_reason


@pytest.mark.django_db
def test_the_lowest_priority_borrower_goes_first_and_only_as_many_as_needed(
    teams, django_capture_on_commit_callbacks
):
    lab, lea, vision, vic = teams
    high, low, mid = run_borrowers(
        vision,
        vic,
        django_capture_on_commit_callbacks,
        (2, 5, T0 - 60 * MIN, None),
        (2, -1, T0 - 60 * MIN, None),
        (2, 0, T0 - 60 * MIN, None),
    )
    mine = queued_job(lab, lea, total_gpus=4)  # lab: 6 of 8 lent, room for 2 of its own
    tick(T0, django_capture_on_commit_callbacks)
    assert preempted(high, low, mid) == [False, True, False]
    assert Engine.notices == [(f"ref-{low.current_attempt.backend_name}", 90)]
    assert reason(mine) == (
        "waiting for lent GPUs: 6 of team lab's 8 GPUs are lent to other teams; preempting "
        "1 job(s) on them (2 GPUs), which have 1 min 30 s to checkpoint"
    )
    notes = JobEvent.objects.filter(job=low, kind=JobEvent.Kind.NOTE)
    assert notes.get().reason == (
        "preemption notice: the lending team needs back the 2 GPUs this job borrowed; SIGTERM "
        "now, SIGKILL in 1 min 30 s; then PAUSED and queued again"
    )
    assert len(notes.get().reason) <= 160  # whole in the Events tab
    assert JobEvent.objects.filter(job=mine, kind=JobEvent.Kind.NOTE).get().reason == (
        "preempting 1 job(s) on 2 GPUs that other teams borrowed from team lab: this job "
        "needs them back"
    )


@pytest.mark.django_db
def test_among_equal_priorities_the_freshest_checkpoint_then_the_latest_start_goes_first(
    teams, django_capture_on_commit_callbacks
):
    lab, lea, vision, vic = teams
    old, fresh, none_late, none_early = run_borrowers(
        vision,
        vic,
        django_capture_on_commit_callbacks,
        (2, 0, T0 - 90 * MIN, T0 - 30 * MIN),
        (2, 0, T0 - 90 * MIN, T0 - 2 * MIN),
        (2, 0, T0 - 20 * MIN, None),
        (2, 0, T0 - 80 * MIN, None),
    )
    queued_job(lab, lea, total_gpus=2)
    tick(T0, django_capture_on_commit_callbacks)
    assert preempted(old, fresh, none_late, none_early) == [False, True, False, False]
    queued_job(lab, lea, total_gpus=6)  # the rest: the old checkpoint, then the later start
    tick(T0 + MIN, django_capture_on_commit_callbacks)
    assert preempted(old, fresh, none_late, none_early) == [True, True, True, True]
    assert [ref for ref, _ in Engine.notices][1:] == [
        f"ref-{j.current_attempt.backend_name}" for j in (old, none_late, none_early)
    ]


@pytest.mark.django_db
def test_no_job_is_preempted_before_its_minimum_runtime(
    teams, django_capture_on_commit_callbacks, settings
):
    settings.SF_PREEMPT_MIN_RUNTIME_S = 600
    lab, lea, vision, vic = teams
    (young,) = run_borrowers(
        vision, vic, django_capture_on_commit_callbacks, (8, 0, T0 - 4 * MIN, None)
    )
    mine = queued_job(lab, lea, total_gpus=1)
    tick(T0, django_capture_on_commit_callbacks)
    assert preempted(young) == [False] and Engine.notices == []
    assert reason(mine) == (
        "waiting for lent GPUs: 8 of team lab's 8 GPUs are lent to other teams, and too few "
        "of the jobs on them have run the minimum 10 min before they may be preempted; the "
        "next may be preempted at 12:06:00 UTC"
    )
    tick(T0 + 6 * MIN, django_capture_on_commit_callbacks)
    assert preempted(young) == [True]


@pytest.mark.django_db
def test_a_job_inside_its_own_teams_quota_is_never_a_victim(
    teams, django_capture_on_commit_callbacks
):
    lab, lea, vision, vic = teams
    vision.gpu_quota = 2
    vision.save()
    own, borrowed = run_borrowers_own_first(vision, vic, django_capture_on_commit_callbacks)
    queued_job(lab, lea, total_gpus=8)
    tick(T0, django_capture_on_commit_callbacks)
    assert preempted(own, borrowed) == [False, True]


def run_borrowers_own_first(vision, vic, capture):
    """An own-quota job of the lowest priority, then a borrowing one of the highest."""
    own = queued_job(vision, vic, total_gpus=2, priority=-50)
    tick(T0 - dt.timedelta(hours=3), capture)
    borrowed = queued_job(vision, vic, total_gpus=2, priority=50)
    tick(T0 - dt.timedelta(hours=2), capture)
    for job in (own, borrowed):
        job.refresh_from_db()
        Attempt.objects.filter(pk=job.current_attempt_id).update(
            job_ref=f"ref-{job.current_attempt.backend_name}", start_time=T0 - 60 * MIN
        )
        Job.objects.filter(pk=job.pk).update(status=S.RUNNING)
    assert own.current_attempt.borrowed_from_id is None
    assert borrowed.current_attempt.borrowed_from_id is not None
    return own, borrowed


@pytest.mark.django_db
def test_a_lender_past_its_own_quota_preempts_nobody(teams, django_capture_on_commit_callbacks):
    lab, lea, vision, vic = teams
    (borrower,) = run_borrowers(
        vision, vic, django_capture_on_commit_callbacks, (4, 0, T0 - 60 * MIN, None)
    )
    queued_job(lab, lea, total_gpus=9)  # more than lab's whole quota: nothing is owed to it
    tick(T0, django_capture_on_commit_callbacks)
    assert preempted(borrower) == [False]


@pytest.mark.django_db
def test_notices_already_sent_are_counted_before_more_are_sent(
    teams, django_capture_on_commit_callbacks
):
    lab, lea, vision, vic = teams
    first, second = run_borrowers(
        vision,
        vic,
        django_capture_on_commit_callbacks,
        (4, -1, T0 - 60 * MIN, None),
        (4, 0, T0 - 60 * MIN, None),
    )
    mine = queued_job(lab, lea, total_gpus=4)
    tick(T0, django_capture_on_commit_callbacks)
    tick(T0 + MIN, django_capture_on_commit_callbacks)  # the victim is still in its grace
    assert preempted(first, second) == [True, False]
    assert len(Engine.notices) == 1
    assert reason(mine) == (
        "waiting for lent GPUs: 8 of team lab's 8 GPUs are lent to other teams; the jobs on "
        "them have been preempted and give them back by 12:01:30 UTC at the latest"
    )


@pytest.mark.django_db
def test_a_preempted_job_pauses_resumes_without_a_retry_and_its_lender_starts(
    teams, django_capture_on_commit_callbacks
):
    lab, lea, vision, vic = teams
    (victim,) = run_borrowers(
        vision, vic, django_capture_on_commit_callbacks, (8, 0, T0 - 60 * MIN, None)
    )
    Job.objects.filter(pk=victim.pk).update(max_retries=1)
    mine = queued_job(lab, lea, total_gpus=8)
    tick(T0, django_capture_on_commit_callbacks)
    ref = f"ref-{victim.current_attempt.backend_name}"
    Attempt.objects.filter(pk=victim.current_attempt_id).update(checkpoint_at=T0 + MIN / 2)
    assert (
        "Preempted at 12:00:00 UTC: the lending team needs back the GPUs this job borrowed. It "
        "was sent SIGTERM and its notice (sf.should_checkpoint() is true) and is killed at "
        "12:01:30 UTC unless it exits first; it then goes PAUSED and is queued again to resume "
        "from its checkpoint (its newest checkpoint: 12:00:30 UTC)."
    ) in explain(Job.objects.get(pk=victim.pk), now=T0 + MIN)
    # It checkpoints and exits non-zero 40 s into its grace: the end the engine reports.
    Engine.ends[ref] = Observation("FAILED", exit_code=143, end_time=T0 + dt.timedelta(seconds=40))
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_all(now=T0 + dt.timedelta(seconds=45))
    victim.refresh_from_db()
    attempt = Attempt.objects.get(pk=victim.current_attempt_id)
    assert victim.status == S.PAUSED
    assert victim.status_reason == "preempted: borrowed GPUs returned to the lending team"
    assert attempt.end_time == T0 + dt.timedelta(seconds=40)  # billed as run, to the second
    assert victim.retry_count == 0 and victim.next_attempt_at is None
    assert (
        "Attempt 1 was preempted at 12:00:00 UTC: the lending team took back the 8 GPUs it had "
        "borrowed. It ran 1 h (billed as run) and ended at 12:00:40 UTC (its newest checkpoint: "
        "12:00:30 UTC); the scheduler queues it again on its next tick. A resume after a "
        "preemption spends no retry."
    ) in explain(victim)
    tick(T0 + dt.timedelta(seconds=50), django_capture_on_commit_callbacks)
    victim.refresh_from_db()
    mine.refresh_from_db()
    assert mine.status == S.SUBMITTED
    assert victim.status == S.QUEUED and victim.retry_count == 0
    assert victim.status_reason.startswith("waiting for quota: team vision uses 0 of 0 GPUs")
    assert paused_jobs([victim.pk]) == []  # no longer the preemption's to queue again
    timeline = list(
        JobEvent.objects.filter(job=victim, kind=JobEvent.Kind.STATUS)
        .order_by("id")
        .values_list("to_status", "reason")
    )
    assert timeline[-2:] == [
        (S.PAUSED, "preempted: borrowed GPUs returned to the lending team"),
        (S.QUEUED, "resuming after preemption; waiting for the scheduler"),
    ]
    meter_ended()
    now = timezone.now()
    assert [*quotas_now(now), *admissions(now)] == []


@pytest.mark.django_db
def test_a_victim_past_its_grace_is_cancelled_every_tick_until_it_ends(
    teams, django_capture_on_commit_callbacks, api_as
):
    vic = teams[3]
    victim = preempted_borrower(teams, django_capture_on_commit_callbacks)
    read = api_as(vic).get(f"/jobs/{victim.pk}").json()
    assert (read["borrowed"], read["preempted_at"], read["preempt_kill_at"]) == (
        True,
        "2026-12-02T12:00:00Z",
        "2026-12-02T12:01:30Z",
    )
    ref = f"ref-{victim.current_attempt.backend_name}"
    reconcile_all(now=T0 + dt.timedelta(seconds=60))  # within the 90 s grace
    assert Engine.cancels == []
    reconcile_all(now=T0 + dt.timedelta(seconds=95))
    reconcile_all(now=T0 + dt.timedelta(seconds=100))
    assert Engine.cancels == [ref, ref]
    Engine.ends[ref] = Observation("FAILED", exit_code=-9, end_time=T0 + dt.timedelta(seconds=101))
    reconcile_all(now=T0 + dt.timedelta(seconds=105))
    victim.refresh_from_db()
    assert victim.status == S.PAUSED and paused_jobs([victim.pk]) == [victim.pk]


@pytest.mark.django_db
def test_a_job_that_succeeded_before_its_notice_succeeds(teams, django_capture_on_commit_callbacks):
    victim = preempted_borrower(teams, django_capture_on_commit_callbacks)
    ends(victim, "DONE", 0, at_s=-2)
    victim.refresh_from_db()
    assert victim.status == S.SUCCEEDED


@pytest.mark.django_db
def test_no_preemption_loop_a_resumed_job_runs_its_minimum_before_another_notice(
    teams, django_capture_on_commit_callbacks, settings
):
    settings.SF_PREEMPT_MIN_RUNTIME_S = 600
    lab, lea, vision, vic = teams
    (victim,) = run_borrowers(
        vision, vic, django_capture_on_commit_callbacks, (4, 0, T0 - 60 * MIN, None)
    )
    first = queued_job(lab, lea, total_gpus=8)
    tick(T0, django_capture_on_commit_callbacks)
    first_ref = f"ref-{victim.current_attempt.backend_name}"
    ends(victim, "FAILED", 143, at_s=30)
    tick(T0 + dt.timedelta(seconds=40), django_capture_on_commit_callbacks)  # lab's job starts
    # lab's job ends; the victim borrows again and runs from T0 + 2 min ...
    Job.objects.filter(pk=first.pk).update(status=S.SUCCEEDED)
    Attempt.objects.filter(job=first).update(end_time=T0 + 2 * MIN, start_time=T0 + MIN)
    tick(T0 + 2 * MIN, django_capture_on_commit_callbacks)
    victim.refresh_from_db()
    assert victim.status == S.SUBMITTED and victim.current_attempt.borrowed_from_id
    Attempt.objects.filter(pk=victim.current_attempt_id).update(
        job_ref="ref-second", start_time=T0 + 2 * MIN
    )
    Job.objects.filter(pk=victim.pk).update(status=S.RUNNING)
    # ... and lab wants its GPUs again 5 min later: not before the minimum runtime.
    queued_job(lab, lea, total_gpus=8)
    tick(T0 + 7 * MIN, django_capture_on_commit_callbacks)
    assert preempted(victim) == [False]
    tick(T0 + 12 * MIN + dt.timedelta(seconds=1), django_capture_on_commit_callbacks)
    assert preempted(victim) == [True]
    assert [ref for ref, _ in Engine.notices] == [first_ref, "ref-second"]


@pytest.mark.django_db
def test_a_persons_stop_of_a_preempted_job_is_kept_not_queued_again(
    teams, django_capture_on_commit_callbacks, api_as
):
    vic = teams[3]
    victim = preempted_borrower(teams, django_capture_on_commit_callbacks)
    ends(victim, "FAILED", 143, at_s=30)
    assert api_as(vic).post(f"/jobs/{victim.pk}/stop").status_code == 200
    tick(T0 + dt.timedelta(seconds=40), django_capture_on_commit_callbacks)
    victim.refresh_from_db()
    assert victim.status == S.STOPPED and paused_jobs([victim.pk]) == []


@pytest.mark.django_db
def test_a_victim_gone_from_its_engine_after_its_notice_pauses_without_the_lost_grace(
    teams, django_capture_on_commit_callbacks, settings
):
    settings.SF_LOST_GRACE_S = 60
    victim = preempted_borrower(teams, django_capture_on_commit_callbacks)
    reconcile_all(now=T0 + dt.timedelta(seconds=5))  # seen running: its last sighting
    Engine.gone.add(f"ref-{victim.current_attempt.backend_name}")
    reconcile_all(now=T0 + dt.timedelta(seconds=20))  # past the sighting's 10 s resolution
    victim.refresh_from_db()
    assert (victim.status, victim.status_reason) == (
        S.PAUSED,
        "preempted: borrowed GPUs returned to the lending team",
    )
