"""Every control verb from every state, through the API, against docs/ARCHITECTURE.md ("States").

Each case starts from a job placed in a state with the attempt that state implies: an open
attempt with a backend object for SUBMITTED/PENDING/RUNNING, a closed one for the finished
states and PAUSED, none for QUEUED. Allowed verbs move the row, write one event, close an open
attempt and cancel its backend object after commit; forbidden ones answer 409 and write nothing.
"""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.loops import scheduler
from jobs.models import Attempt, Job, JobEvent
from jobs.states import ALLOWED_TRANSITIONS, JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db

S = JobStatus
STATES = list(S)
VERBS = ["stop", "pause", "resume", "retry"]
TARGET = {"stop": S.STOPPED, "pause": S.PAUSED, "resume": S.QUEUED, "retry": S.QUEUED}
ALLOWED_FROM = {
    "stop": {S.QUEUED, S.SUBMITTED, S.PENDING, S.RUNNING, S.PAUSED, S.FAILED},
    "pause": {S.QUEUED, S.SUBMITTED, S.PENDING, S.RUNNING},
    "resume": {S.PAUSED},
    "retry": {S.FAILED, S.STOPPED},
}
OPEN_ATTEMPT = {S.SUBMITTED, S.PENDING, S.RUNNING}
ALLOWED = [(v, s) for v in VERBS for s in STATES if s in ALLOWED_FROM[v]]
FORBIDDEN = [(v, s) for v in VERBS for s in STATES if s not in ALLOWED_FROM[v]]
HALTS = [(v, s) for v, s in ALLOWED if v in ("stop", "pause")]
REQUEUES = [(v, s) for v, s in ALLOWED if v in ("resume", "retry")]


def case_id(case) -> str:
    return f"{case[0]}-from-{case[1]}"


@pytest.fixture
def make_job(team, alice, backend, kicks):
    def make(status: str) -> Job:
        job = queued_job(team, alice)
        if status == S.QUEUED:
            return job
        if status in OPEN_ATTEMPT:
            with_attempt(job, status, job_ref="ref-1")
        else:
            started = timezone.now() - dt.timedelta(minutes=5)
            with_attempt(
                job,
                status,
                job_ref="ref-1",
                start_time=started,
                end_time=started + dt.timedelta(minutes=1),
                end_reason="earlier end",
            )
        job.refresh_from_db()
        return job

    return make


@pytest.fixture
def act(api, django_capture_on_commit_callbacks):
    """POST a verb and run what the request scheduled for after commit (the cancel)."""

    def post(job: Job, verb: str):
        with django_capture_on_commit_callbacks(execute=True):
            return api.post(f"/jobs/{job.pk}/{verb}")

    return post


def ledger(backend) -> dict:
    return {
        "jobs": list(
            Job.objects.order_by("pk").values_list(
                "pk",
                "status",
                "status_reason",
                "retry_count",
                "attempt_count",
                "current_attempt",
                "next_attempt_at",
                "run_id",
            )
        ),
        "events": list(JobEvent.objects.order_by("pk").values_list("pk", flat=True)),
        "attempts": list(
            Attempt.objects.order_by("pk").values_list("pk", "job_ref", "end_time", "end_reason")
        ),
        "cancelled": list(backend.cancelled),
        "submitted": list(backend.submitted),
    }


def test_the_matrix_agrees_with_the_transition_table():
    for verb, sources in ALLOWED_FROM.items():
        for state in STATES:
            allowed_by_table = TARGET[verb] in ALLOWED_TRANSITIONS[state]
            if verb == "resume":  # resume is PAUSED -> QUEUED only
                allowed_by_table = state == S.PAUSED
            if verb == "retry":  # retry is FAILED/STOPPED -> QUEUED only
                allowed_by_table = state in (S.FAILED, S.STOPPED)
            assert (state in sources) == allowed_by_table, (verb, state)


# -- allowed verbs --------------------------------------------------------------------------------


@pytest.mark.parametrize(("verb", "status"), ALLOWED, ids=case_id)
def test_an_allowed_verb_moves_the_job_to_its_target_status(make_job, act, verb, status):
    job = make_job(status)
    response = act(job, verb)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == TARGET[verb]
    assert Job.objects.get(pk=job.pk).status == TARGET[verb]


@pytest.mark.parametrize(("verb", "status"), ALLOWED, ids=case_id)
def test_an_allowed_verb_keeps_the_row_and_its_run_id(make_job, act, verb, status):
    job = make_job(status)
    body = act(job, verb).json()
    assert (body["id"], body["run_id"]) == (job.pk, job.run_id)
    assert Job.objects.count() == 1
    assert Job.objects.get().run_id == job.run_id


@pytest.mark.parametrize(("verb", "status"), ALLOWED, ids=case_id)
def test_an_allowed_verb_writes_one_event_from_the_old_status_to_the_new_by_the_user(
    make_job, act, verb, status
):
    job = make_job(status)
    before = set(JobEvent.objects.filter(job=job).values_list("pk", flat=True))
    act(job, verb)
    new = JobEvent.objects.filter(job=job).exclude(pk__in=before)
    status_events = new.filter(kind=JobEvent.Kind.STATUS)
    assert list(status_events.values_list("from_status", "to_status", "actor")) == [
        (status, TARGET[verb], "alice")
    ]


@pytest.mark.parametrize(("verb", "status"), ALLOWED, ids=case_id)
def test_an_allowed_verb_gives_a_status_reason_naming_the_user(make_job, act, verb, status):
    job = make_job(status)
    act(job, verb)
    reason = Job.objects.get(pk=job.pk).status_reason
    word = {"stop": "stopped", "pause": "paused", "resume": "resumed", "retry": "retried"}[verb]
    assert reason.startswith(f"{word} by alice")


@pytest.mark.parametrize(("verb", "status"), HALTS, ids=case_id)
def test_stop_and_pause_leave_no_attempt_open(make_job, act, verb, status):
    job = make_job(status)
    act(job, verb)
    assert not Attempt.objects.filter(job=job, end_time__isnull=True).exists()


@pytest.mark.parametrize(
    ("verb", "status"), [c for c in HALTS if c[1] in OPEN_ATTEMPT], ids=case_id
)
def test_stop_and_pause_close_an_open_attempt_with_the_reason(make_job, act, verb, status):
    job = make_job(status)
    act(job, verb)
    attempt = Attempt.objects.get(job=job)
    assert attempt.end_time is not None
    word = "stopped" if verb == "stop" else "paused"
    assert attempt.end_reason == f"{word} by alice"


@pytest.mark.parametrize(
    ("verb", "status"), [c for c in HALTS if c[1] not in OPEN_ATTEMPT], ids=case_id
)
def test_stop_and_pause_leave_an_already_closed_attempt_as_it_was(make_job, act, verb, status):
    job = make_job(status)
    before = list(Attempt.objects.filter(job=job).values_list("end_time", "end_reason"))
    act(job, verb)
    after = list(Attempt.objects.filter(job=job).values_list("end_time", "end_reason"))
    assert after == before


@pytest.mark.parametrize(("verb", "status"), HALTS, ids=case_id)
def test_stop_and_pause_cancel_the_backend_object_exactly_when_one_is_live(
    make_job, act, backend, verb, status
):
    job = make_job(status)
    act(job, verb)
    assert backend.cancelled == (["ref-1"] if status in OPEN_ATTEMPT else [])


@pytest.mark.parametrize(
    ("verb", "status"), [c for c in HALTS if c[1] in OPEN_ATTEMPT], ids=case_id
)
def test_the_cancel_waits_for_the_commit(api, make_job, backend, verb, status):
    job = make_job(status)
    api.post(f"/jobs/{job.pk}/{verb}")  # the test transaction never commits
    assert backend.cancelled == []


@pytest.mark.parametrize(("verb", "status"), ALLOWED, ids=case_id)
def test_no_verb_launches_anything_on_the_backend(make_job, act, backend, verb, status):
    job = make_job(status)
    act(job, verb)
    assert backend.submitted == []


@pytest.mark.parametrize(("verb", "status"), ALLOWED, ids=case_id)
def test_only_retry_counts_a_retry(make_job, act, verb, status):
    job = make_job(status)
    body = act(job, verb).json()
    expected = job.retry_count + (1 if verb == "retry" else 0)
    assert body["retry_count"] == expected
    assert Job.objects.get(pk=job.pk).retry_count == expected


@pytest.mark.parametrize(("verb", "status"), REQUEUES, ids=case_id)
def test_resume_and_retry_create_no_attempt_themselves(make_job, act, verb, status):
    job = make_job(status)
    act(job, verb)
    job.refresh_from_db()
    assert Attempt.objects.filter(job=job).count() == 1
    assert job.attempt_count == 1


@pytest.mark.parametrize(("verb", "status"), REQUEUES, ids=case_id)
def test_resume_and_retry_kick_the_scheduler_after_commit(make_job, act, kicks, verb, status):
    job = make_job(status)
    act(job, verb)
    assert kicks == ["tick"]


@pytest.mark.parametrize(("verb", "status"), REQUEUES, ids=case_id)
def test_the_scheduler_then_starts_the_next_attempt_of_the_same_run(
    make_job, act, backend, monkeypatch, verb, status
):
    job = make_job(status)
    run_id = job.run_id
    act(job, verb)
    result = scheduler.admit_queued_jobs()
    job.refresh_from_db()
    assert job.status == S.SUBMITTED
    assert job.run_id == run_id
    attempt = job.current_attempt
    assert result.admitted == [attempt.pk]
    assert (attempt.number, job.attempt_count) == (2, 2)
    assert attempt.backend_name == f"sf-{job.run_id}-a2"
    assert attempt.job_ref == "" and attempt.end_time is None


# -- forbidden verbs ------------------------------------------------------------------------------


@pytest.mark.parametrize(("verb", "status"), FORBIDDEN, ids=case_id)
def test_a_forbidden_verb_is_409_naming_the_current_status(make_job, act, verb, status):
    job = make_job(status)
    response = act(job, verb)
    assert response.status_code == 409, response.content
    body = response.json()
    assert f"job {job.pk} is {status}" in body["detail"]
    assert body["status"] == status


@pytest.mark.parametrize(("verb", "status"), FORBIDDEN, ids=case_id)
def test_a_forbidden_verb_changes_nothing(make_job, act, backend, kicks, verb, status):
    job = make_job(status)
    before = ledger(backend)
    act(job, verb)
    assert ledger(backend) == before
    assert kicks == []
