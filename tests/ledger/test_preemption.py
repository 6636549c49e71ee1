"""`jobs.ledger.preemption`, step by step: a notice marks a borrower's attempt once and is given
after commit, its end pauses the job with the preemption's reason, and the next tick's requeue
takes back only the jobs still the preemption's (a person's or a window's pause since is
theirs). A fixed clock; the engine a fake that records the notices."""

import datetime as dt

import pytest

from jobs.executors.base import Capacity
from jobs.ledger import preemption
from jobs.ledger.halt import halt
from jobs.ledger.transitions import transition
from jobs.models import Attempt, Cluster, Job, JobEvent
from jobs.reads.preemption import PAUSED_REASON, Borrower, paused_jobs
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

S = JobStatus
T0 = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
SEC = dt.timedelta(seconds=1)


class Engine:
    """Records the notices it is given."""

    STATE_TABLE: dict = {}
    PREEMPT_BY_TERM = False
    notices: list[tuple[str, int]] = []

    def __init__(self, cluster) -> None:
        pass

    def preempt(self, ref: str, grace_s: int) -> None:
        self.notices.append((ref, grace_s))

    def capacity(self) -> Capacity:
        return Capacity(reachable=True, total_gpus=8)


@pytest.fixture
def cluster(db, use_executor):
    Engine.notices = []
    made = Cluster.objects.create(name="gpu", kind="noop", settings={"preempt_grace_s": 90})
    use_executor(Engine, made)
    return made


@pytest.fixture
def borrower(cluster, make_team, make_user):
    """A job of team vision running on 4 GPUs borrowed from team lab, up since T0."""
    lab, vision = make_team("lab", cluster=cluster), make_team("vision", cluster=cluster)
    job = queued_job(vision, make_user("vic", vision), total_gpus=4)
    attempt = with_attempt(
        job, S.RUNNING, submitted_at=T0, start_time=T0, job_ref="ref-1", borrowed_from=lab
    )
    return Attempt.objects.select_related("job").get(pk=attempt.pk)


def victim(attempt: Attempt) -> Borrower:
    return Borrower(
        attempt.pk, attempt.job_id, attempt.borrowed_from_id, attempt.job.cluster_id, 4, 0,
        attempt.job_ref, attempt.start_time, None, None,
    )  # fmt: skip


def notice_for(attempt: Attempt, make_user) -> preemption.Notice:
    lab = attempt.borrowed_from
    mine = queued_job(lab, make_user("lea", lab), total_gpus=4)
    return preemption.Notice(mine.pk, lab.name, [victim(attempt)])


def paused(attempt: Attempt) -> Job:
    preemption.pause(attempt, T0 + 60 * SEC, end=T0 + 50 * SEC, code=143)
    return Job.objects.get(pk=attempt.job_id)


@pytest.mark.django_db
def test_a_notice_marks_the_attempt_once_and_is_given_after_commit(
    borrower, cluster, make_user, django_capture_on_commit_callbacks
):
    notice = notice_for(borrower, make_user)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert preemption.send_notices([notice], {cluster.pk: cluster}, T0) == [borrower.job_id]
        assert Engine.notices == []  # nothing told before the tick commits
    assert len(callbacks) == 1 and Engine.notices == [("ref-1", 90)]
    attempt = Attempt.objects.get(pk=borrower.pk)
    assert (attempt.preempted_at, attempt.preempted_for_id) == (T0, notice.job)
    assert JobEvent.objects.filter(job_id=borrower.job_id, kind="note").count() == 1
    assert JobEvent.objects.get(job_id=notice.job).reason.startswith("preempting 1 job(s)")
    # A second notice for the same attempt (another tick's) tells nothing.
    assert preemption.send_notices([notice], {cluster.pk: cluster}, T0 + SEC) == []
    assert Attempt.objects.get(pk=borrower.pk).preempted_at == T0


@pytest.mark.django_db
def test_an_attempt_that_ended_since_the_tick_read_it_is_told_nothing(borrower, cluster, make_user):
    Attempt.objects.filter(pk=borrower.pk).update(end_time=T0)
    notice = notice_for(borrower, make_user)
    assert preemption.send_notices([notice], {cluster.pk: cluster}, T0) == []
    assert Attempt.objects.get(pk=borrower.pk).preempted_at is None


@pytest.mark.django_db
def test_its_end_pauses_the_job_billed_as_run_and_spends_no_retry(borrower, cluster, make_user):
    preemption.send_notices([notice_for(borrower, make_user)], {cluster.pk: cluster}, T0)
    job = paused(borrower)
    attempt = Attempt.objects.get(pk=borrower.pk)
    assert (job.status, job.status_reason) == (S.PAUSED, PAUSED_REASON)
    assert (attempt.end_time, attempt.exit_code, attempt.failure) == (T0 + 50 * SEC, 143, "")
    assert job.retry_count == 0 and job.next_attempt_at is None
    assert paused_jobs() == [job.pk]


@pytest.mark.django_db
def test_its_bill_never_passes_the_engines_own_end(borrower, cluster, make_user):
    """As for every end (`jobs.ledger.clocks`): the runner's exit came after the engine's own
    end, so the engine's end is billed, and both are kept on the attempt."""
    preemption.send_notices([notice_for(borrower, make_user)], {cluster.pk: cluster}, T0)
    engine = (T0 - SEC, T0 + 48 * SEC)
    preemption.pause(borrower, T0 + 60 * SEC, end=T0 + 50 * SEC, code=143, engine=engine)
    attempt = Attempt.objects.get(pk=borrower.pk)
    assert (attempt.engine_start, attempt.engine_end) == engine
    assert attempt.end_time == T0 + 48 * SEC


@pytest.mark.django_db
def test_requeue_takes_back_only_the_jobs_still_the_preemptions(borrower, cluster, make_user):
    preemption.send_notices([notice_for(borrower, make_user)], {cluster.pk: cluster}, T0)
    job = paused(borrower)
    assert preemption.requeue() == [job.pk]
    job.refresh_from_db()
    assert (job.status, job.status_reason) == (S.QUEUED, preemption.REQUEUE_REASON)
    assert preemption.requeue() == []  # run twice: nothing more


@pytest.mark.django_db
def test_a_pause_during_the_notice_or_after_a_resume_is_the_persons(borrower, cluster, make_user):
    preemption.send_notices([notice_for(borrower, make_user)], {cluster.pk: cluster}, T0)
    job_id = borrower.job_id
    halt([job_id], S.PAUSED, "paused by vic", actor="vic", now=T0 + 10 * SEC)  # in its grace
    assert paused_jobs() == [] and preemption.requeue() == []
    # Resumed, then paused again while it waits: its attempt still bears the notice.
    transition(job_id, S.QUEUED, reason="resumed by vic", actor="vic")
    halt([job_id], S.PAUSED, "paused by vic", actor="vic", now=T0 + 20 * SEC)
    assert preemption.requeue() == []
    assert Job.objects.get(pk=job_id).status == S.PAUSED


@pytest.mark.django_db
def test_a_window_that_closes_during_the_notice_keeps_the_job_for_the_window(
    borrower, cluster, make_user
):
    preemption.send_notices([notice_for(borrower, make_user)], {cluster.pk: cluster}, T0)
    reason = "paused: window nights closed; the job resumes when it opens"
    halt([borrower.job_id], S.PAUSED, reason, actor="scheduler", now=T0, by_window=True)
    assert preemption.requeue() == []
    assert Job.objects.get(pk=borrower.job_id).paused_by_window
