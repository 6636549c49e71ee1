"""The control verbs over the API: stop, pause, resume, retry; who may, and from which states."""

import pytest

from jobs.models import Attempt, Job, JobEvent
from jobs.stores.snapshots import snapshot_path
from tests.api_helpers import assert_refused, submit, upload_snapshot

pytestmark = pytest.mark.django_db


def put_in(job_id: int, status: str) -> None:
    Job.objects.filter(pk=job_id).update(status=status)  # test setup: place the job in a state


def ledger() -> tuple[list, list, list]:
    jobs = Job.objects.order_by("pk").values_list(
        "pk", "status", "status_reason", "retry_count", "attempt_count", "run_id"
    )
    events = JobEvent.objects.order_by("pk").values_list("pk", flat=True)
    attempts = Attempt.objects.order_by("pk").values_list("pk", "end_time", "end_reason")
    return list(jobs), list(events), list(attempts)


def start_attempt(job_id: int, status: str = "RUNNING") -> Attempt:
    attempt = Attempt.objects.create(
        job_id=job_id, number=1, total_gpus=1, backend_name="a-1", job_ref="ref-1"
    )
    Job.objects.filter(pk=job_id).update(current_attempt=attempt, attempt_count=1)
    put_in(job_id, status)
    return attempt


@pytest.fixture
def viewer(api_as, make_user, team):
    return api_as(make_user("victor", team, role="viewer"))


@pytest.fixture
def stranger(api_as, make_team, make_user):
    return api_as(make_user("carol", make_team("audio")))


# -- allowed changes ------------------------------------------------------------------------------


def test_stopping_a_queued_job_makes_it_stopped_with_an_event(api):
    job_id = submit(api)
    response = api.post(f"/jobs/{job_id}/stop")
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["terminal"]) == ("STOPPED", True)
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.status_reason) == ("STOPPED", "stopped by alice")
    event = JobEvent.objects.filter(job_id=job_id).latest("pk")
    assert (event.from_status, event.to_status, event.actor) == ("QUEUED", "STOPPED", "alice")


def test_stopping_a_running_job_ends_its_current_attempt(api):
    job_id = submit(api)
    attempt = start_attempt(job_id)
    assert api.post(f"/jobs/{job_id}/stop").status_code == 200
    attempt.refresh_from_db()
    assert attempt.end_time is not None and attempt.end_reason == "stopped by alice"
    assert JobEvent.objects.filter(job_id=job_id).latest("pk").attempt == 1


def test_a_teammate_can_stop_my_job(api, api_as, make_user, team):
    job_id = submit(api)
    bob = api_as(make_user("bob", team))
    assert bob.post(f"/jobs/{job_id}/stop").json()["status"] == "STOPPED"
    assert JobEvent.objects.filter(job_id=job_id).latest("pk").actor == "bob"


def test_pausing_then_resuming_goes_back_through_queued(api):
    job_id = submit(api)
    assert api.post(f"/jobs/{job_id}/pause").json()["status"] == "PAUSED"
    assert api.post(f"/jobs/{job_id}/resume").json()["status"] == "QUEUED"
    transitions = JobEvent.objects.filter(job_id=job_id).values_list("from_status", "to_status")
    assert list(transitions.order_by("pk")) == [
        ("", "QUEUED"),
        ("QUEUED", "PAUSED"),
        ("PAUSED", "QUEUED"),
    ]


def test_retrying_a_stopped_job_requeues_the_same_row_and_run_id(api):
    job_id = submit(api)
    run_id = Job.objects.get(pk=job_id).run_id
    api.post(f"/jobs/{job_id}/stop")
    response = api.post(f"/jobs/{job_id}/retry")
    assert response.status_code == 200
    body = response.json()
    assert (body["id"], body["run_id"], body["status"], body["retry_count"]) == (
        job_id,
        run_id,
        "QUEUED",
        1,
    )
    assert Job.objects.count() == 1
    job = Job.objects.get()
    assert (job.status, job.retry_count, job.run_id) == ("QUEUED", 1, run_id)
    event = JobEvent.objects.filter(job_id=job_id).latest("pk")
    assert (event.from_status, event.to_status, event.actor) == ("STOPPED", "QUEUED", "alice")


def test_retrying_a_failed_job_counts_each_retry(api):
    job_id = submit(api)
    for expected in (1, 2):
        put_in(job_id, "FAILED")
        assert api.post(f"/jobs/{job_id}/retry").json()["retry_count"] == expected
    assert Job.objects.get(pk=job_id).retry_count == 2


def test_retry_of_a_job_with_its_snapshot_present_is_allowed(api):
    job_id = submit(api, snapshot=upload_snapshot(api))
    put_in(job_id, "FAILED")
    assert api.post(f"/jobs/{job_id}/retry").json()["status"] == "QUEUED"


# -- refused, and nothing written -----------------------------------------------------------------


def test_retry_when_the_snapshot_was_deleted_is_409_and_says_so(api):
    job_id = submit(api, snapshot=upload_snapshot(api))
    put_in(job_id, "FAILED")
    snapshot_path(Job.objects.get(pk=job_id).snapshot_id).unlink()
    before = ledger()
    assert_refused(api.post(f"/jobs/{job_id}/retry"), 409, "snapshot was deleted")
    assert ledger() == before


@pytest.mark.parametrize(
    ("verb", "status"),
    [
        ("stop", "SUCCEEDED"),
        ("pause", "SUCCEEDED"),
        ("pause", "STOPPED"),
        ("resume", "RUNNING"),
        ("resume", "QUEUED"),
        ("retry", "QUEUED"),
        ("retry", "RUNNING"),
        ("retry", "SUCCEEDED"),
        ("stop", "STOPPED"),
    ],
)
def test_a_forbidden_transition_is_409_naming_the_current_status(api, verb, status):
    job_id = submit(api)
    put_in(job_id, status)
    before = ledger()
    body = assert_refused(api.post(f"/jobs/{job_id}/{verb}"), 409, f"job {job_id} is {status}")
    assert body["status"] == status
    assert ledger() == before


def test_stopping_a_succeeded_job_leaves_its_attempt_untouched(api):
    job_id = submit(api)
    attempt = start_attempt(job_id, "SUCCEEDED")
    assert_refused(api.post(f"/jobs/{job_id}/stop"), 409, "SUCCEEDED")
    attempt.refresh_from_db()
    assert (attempt.end_time, attempt.end_reason) == (None, "")


@pytest.mark.parametrize("verb", ["stop", "pause", "resume", "retry"])
def test_a_viewer_cannot_control_a_job_but_can_still_read_it(api, viewer, verb):
    job_id = submit(api)
    put_in(job_id, "PAUSED" if verb == "resume" else "STOPPED" if verb == "retry" else "QUEUED")
    before = ledger()
    assert_refused(viewer.post(f"/jobs/{job_id}/{verb}"), 403, "viewer")
    assert ledger() == before
    assert viewer.get(f"/jobs/{job_id}").status_code == 200


@pytest.mark.parametrize("verb", ["stop", "pause", "resume", "retry"])
def test_a_job_of_another_team_is_404_and_cannot_be_controlled(api, stranger, verb):
    job_id = submit(stranger)
    put_in(job_id, "PAUSED" if verb == "resume" else "STOPPED" if verb == "retry" else "QUEUED")
    before = ledger()
    assert_refused(api.post(f"/jobs/{job_id}/{verb}"), 404, f"job {job_id} does not exist")
    assert ledger() == before


def test_an_unknown_job_id_cannot_be_stopped(api):
    submit(api)
    before = ledger()
    assert_refused(api.post("/jobs/999999/stop"), 404, "does not exist")
    assert ledger() == before


def test_control_without_a_token_is_401(api, client):
    job_id = submit(api)
    before = ledger()
    response = client.post(f"/api/v1/jobs/{job_id}/stop")
    assert_refused(response, 401, "token")
    assert ledger() == before


def test_staff_can_stop_a_job_of_any_team(api_as, make_user, stranger):
    job_id = submit(stranger)
    admin = make_user("root")
    admin.is_staff = True
    admin.save()
    assert api_as(admin).post(f"/jobs/{job_id}/stop").json()["status"] == "STOPPED"
    assert Job.objects.get(pk=job_id).status == "STOPPED"
