"""Deleting a job (API and Django admin), shared snapshots, and what retry says when one is gone."""

import datetime as dt
import gzip
import io
import tarfile
import threading
import time

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from jobs.actions import control
from jobs.models import (
    Attempt,
    Job,
    JobEvent,
    LogStream,
    MetricChunk,
    MetricRollup,
    MetricSeries,
    MetricStream,
    Snapshot,
)
from jobs.states import JobStatus
from jobs.stores import logstore
from jobs.stores.metrics import ingest
from jobs.stores.snapshots import snapshot_path
from tests.api_helpers import assert_refused, submit
from tests.factories import place, with_attempt

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("kicks")]

S = JobStatus
FINISHED = [S.SUCCEEDED, S.FAILED, S.STOPPED, S.PAUSED]
BUSY = [S.QUEUED, S.SUBMITTED, S.PENDING, S.RUNNING]
ONLY_FAILED_OR_STOPPED = "only FAILED or STOPPED jobs can be retried"


@pytest.fixture
def viewer(api_as, make_user, team):
    return api_as(make_user("victor", team, role="viewer"))


@pytest.fixture
def stranger(api_as, make_team, make_user):
    return api_as(make_user("carol", make_team("audio")))


@pytest.fixture
def remove(django_capture_on_commit_callbacks):
    """DELETE a job through the API and run what it scheduled for after commit."""

    def delete(client, job_id: int):
        with django_capture_on_commit_callbacks(execute=True):
            return client.client.delete(f"/api/v1/jobs/{job_id}")

    return delete


def tree_archive(files: dict[str, bytes] | None = None) -> bytes:
    """The same tree always gives the same bytes (fixed gzip and tar times)."""
    files = files or {"train.py": b"print('hi')\n"}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def upload(api, archive: bytes) -> dict:
    response = api.client.post("/api/v1/snapshots", archive, content_type="application/gzip")
    assert response.status_code == 201, response.content
    return response.json()


def finished_job(api, status: str, **fields) -> int:
    """A submitted job placed in a finished state with a closed attempt and some log lines."""
    job_id = submit(api, **fields)
    job = Job.objects.get(pk=job_id)
    end = timezone.now()
    with_attempt(
        job, status, job_ref="ref-1", start_time=end - dt.timedelta(minutes=1), end_time=end
    )
    logstore.append(job_id, 1, [{"seq": 0, "stream": "stdout", "ts": 1.0, "text": "epoch 1"}])
    return job_id


def busy_job(api, status: str) -> int:
    job_id = submit(api)
    if status != S.QUEUED:
        with_attempt(Job.objects.get(pk=job_id), status, job_ref="ref-1")
    return job_id


def ledger() -> dict:
    return {
        "jobs": list(Job.objects.order_by("pk").values_list("pk", "status", "status_reason")),
        "attempts": list(Attempt.objects.order_by("pk").values_list("pk", "end_time")),
        "events": list(JobEvent.objects.order_by("pk").values_list("pk", flat=True)),
        "streams": list(LogStream.objects.order_by("pk").values_list("pk", "size")),
        "snapshots": list(Snapshot.objects.order_by("pk").values_list("pk", "deleted_reason")),
    }


# -- the API --------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", FINISHED)
def test_deleting_a_finished_job_answers_204(api, remove, status):
    job_id = finished_job(api, status)
    response = remove(api, job_id)
    assert response.status_code == 204
    assert response.content == b""


@pytest.mark.parametrize("status", FINISHED)
def test_deleting_a_finished_job_removes_its_row_attempts_events_and_log_streams(
    api, remove, status
):
    job_id = finished_job(api, status)
    remove(api, job_id)
    assert not Job.objects.filter(pk=job_id).exists()
    assert not Attempt.objects.filter(job_id=job_id).exists()
    assert not JobEvent.objects.filter(job_id=job_id).exists()
    assert not LogStream.objects.filter(job_id=job_id).exists()


def test_deleting_a_job_removes_its_log_files(api, remove):
    job_id = finished_job(api, S.FAILED)
    log_file = logstore.log_path(job_id, 1)
    assert log_file.exists()
    remove(api, job_id)
    assert not log_file.exists()
    assert not log_file.parent.exists()


def test_deleting_a_job_leaves_other_jobs_and_their_logs_alone(api, remove):
    keep = finished_job(api, S.SUCCEEDED)
    gone = finished_job(api, S.SUCCEEDED)
    remove(api, gone)
    assert Job.objects.filter(pk=keep).exists()
    assert Attempt.objects.filter(job_id=keep).count() == 1
    assert logstore.log_path(keep, 1).exists()


def test_a_deleted_job_is_404_afterwards(api, remove):
    job_id = finished_job(api, S.STOPPED)
    remove(api, job_id)
    assert_refused(api.get(f"/jobs/{job_id}"), 404, f"job {job_id} does not exist")
    assert_refused(remove(api, job_id), 404, f"job {job_id} does not exist")


def test_log_files_stay_until_the_deletion_commits(api):
    job_id = finished_job(api, S.FAILED)
    api.client.delete(f"/api/v1/jobs/{job_id}")  # the test transaction never commits
    assert logstore.log_path(job_id, 1).exists()


@pytest.mark.parametrize("status", BUSY)
def test_deleting_a_queued_or_active_job_is_409_stop_it_first(api, remove, status):
    job_id = busy_job(api, status)
    body = assert_refused(
        remove(api, job_id), 409, f"job {job_id} is {status}", "stop it before deleting"
    )
    assert body["status"] == status


@pytest.mark.parametrize("status", BUSY)
def test_a_refused_deletion_changes_nothing(api, remove, status):
    job_id = busy_job(api, status)
    logstore.append(job_id, 1, [{"seq": 0, "stream": "stdout", "ts": 1.0, "text": "x"}])
    before = ledger()
    remove(api, job_id)
    assert ledger() == before
    assert logstore.log_path(job_id, 1).exists()


def test_a_job_of_another_team_is_404_and_not_deleted(api, stranger, remove):
    job_id = finished_job(stranger, S.FAILED)
    before = ledger()
    assert_refused(remove(api, job_id), 404, f"job {job_id} does not exist")
    assert ledger() == before
    assert logstore.log_path(job_id, 1).exists()


def test_a_viewer_cannot_delete_a_job(api, viewer, remove):
    job_id = finished_job(api, S.FAILED)
    before = ledger()
    assert_refused(remove(viewer, job_id), 403, "viewer")
    assert ledger() == before


def test_deleting_without_a_token_is_401(api, client):
    job_id = finished_job(api, S.FAILED)
    before = ledger()
    assert_refused(client.delete(f"/api/v1/jobs/{job_id}"), 401, "token")
    assert ledger() == before


def test_a_teammate_can_delete_my_finished_job(api, api_as, make_user, team, remove):
    job_id = finished_job(api, S.SUCCEEDED)
    bob = api_as(make_user("bob", team))
    assert remove(bob, job_id).status_code == 204
    assert not Job.objects.filter(pk=job_id).exists()


def test_deleting_a_parent_keeps_its_follow_on_job(api, remove):
    parent_id = finished_job(api, S.SUCCEEDED)
    child_id = submit(api)
    Job.objects.filter(pk=child_id).update(parent_id=parent_id, follow_on_name="eval")
    remove(api, parent_id)
    child = Job.objects.get(pk=child_id)
    assert (child.parent_id, child.follow_on_name) == (None, "eval")


# -- content-addressed snapshots ------------------------------------------------------------------


def test_the_same_tree_uploaded_twice_is_one_blob(api):
    first = upload(api, tree_archive())
    second = upload(api, tree_archive())
    assert first["sha256"] == second["sha256"]
    assert (first["created"], second["created"]) == (True, False)
    assert Snapshot.objects.count() == 1
    blobs = [p for p in snapshot_path(first["sha256"]).parent.parent.rglob("*") if p.is_file()]
    assert blobs == [snapshot_path(first["sha256"])]


def test_two_jobs_of_the_same_tree_share_one_snapshot(api):
    sha = upload(api, tree_archive())["sha256"]
    one = submit(api, snapshot=upload(api, tree_archive())["sha256"])
    two = submit(api, snapshot=sha)
    assert Job.objects.get(pk=one).snapshot_id == Job.objects.get(pk=two).snapshot_id == sha


def test_deleting_one_of_two_jobs_keeps_the_shared_blob(api, remove):
    sha = upload(api, tree_archive())["sha256"]
    first = finished_job(api, S.SUCCEEDED, snapshot=sha)
    finished_job(api, S.FAILED, snapshot=sha)
    remove(api, first)
    assert snapshot_path(sha).exists()
    assert Snapshot.objects.filter(pk=sha).exists()


def test_deleting_the_last_job_of_a_snapshot_removes_the_blob_and_its_row(api, remove):
    sha = upload(api, tree_archive())["sha256"]
    first = finished_job(api, S.SUCCEEDED, snapshot=sha)
    second = finished_job(api, S.FAILED, snapshot=sha)
    remove(api, first)
    remove(api, second)
    assert not snapshot_path(sha).exists()
    assert not Snapshot.objects.filter(pk=sha).exists()


def test_the_remaining_job_can_still_be_retried_after_its_twin_is_deleted(api, remove):
    sha = upload(api, tree_archive())["sha256"]
    first = finished_job(api, S.SUCCEEDED, snapshot=sha)
    second = finished_job(api, S.FAILED, snapshot=sha)
    remove(api, first)
    assert api.get(f"/jobs/{second}").json()["retry_available"] is True
    assert api.post(f"/jobs/{second}/retry").json()["status"] == "QUEUED"


def test_a_refused_deletion_keeps_the_blob(api, remove):
    sha = upload(api, tree_archive())["sha256"]
    job_id = submit(api, snapshot=sha)
    remove(api, job_id)
    assert snapshot_path(sha).exists()
    assert Snapshot.objects.filter(pk=sha).exists()


def test_a_new_job_can_use_the_tree_again_after_its_blob_was_removed(api, remove):
    archive = tree_archive()
    sha = upload(api, archive)["sha256"]
    remove(api, finished_job(api, S.SUCCEEDED, snapshot=sha))
    again = upload(api, archive)
    assert (again["sha256"], again["created"]) == (sha, True)
    assert Job.objects.get(pk=submit(api, snapshot=sha)).snapshot_id == sha


def test_deleting_a_job_whose_blob_was_already_pruned_removes_the_row(api, remove):
    sha = upload(api, tree_archive())["sha256"]
    job_id = finished_job(api, S.FAILED, snapshot=sha)
    snapshot_path(sha).unlink()
    Snapshot.objects.filter(pk=sha).update(deleted_reason="with `prune_snapshots`")
    assert remove(api, job_id).status_code == 204
    assert not Snapshot.objects.filter(pk=sha).exists()


# -- retry availability ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [S.FAILED, S.STOPPED])
def test_retry_is_available_for_a_finished_job_whose_blob_is_present(api, status):
    job_id = finished_job(api, status, snapshot=upload(api, tree_archive())["sha256"])
    body = api.get(f"/jobs/{job_id}").json()
    assert (body["retry_available"], body["retry_unavailable_reason"]) == (True, "")


@pytest.mark.parametrize("status", [S.FAILED, S.STOPPED])
def test_retry_is_available_for_a_job_submitted_without_a_snapshot(api, status):
    job_id = finished_job(api, status)
    assert api.get(f"/jobs/{job_id}").json()["retry_available"] is True


@pytest.mark.parametrize("status", [s for s in S if s not in (S.FAILED, S.STOPPED)])
def test_retry_is_unavailable_in_other_states_and_says_why(api, status):
    job_id = submit(api, snapshot=upload(api, tree_archive())["sha256"])
    place(Job.objects.get(pk=job_id), status)
    body = api.get(f"/jobs/{job_id}").json()
    assert body["retry_available"] is False
    assert ONLY_FAILED_OR_STOPPED in body["retry_unavailable_reason"]
    assert status in body["retry_unavailable_reason"]


def test_the_job_list_carries_retry_availability_too(api):
    """Also for a job listed before its blob went: its row did not change, but the answer
    looks for the blob every time (the rest of the row's answer is kept, jobs.reads.job_rows)."""
    job_id = finished_job(api, S.FAILED, snapshot=upload(api, tree_archive())["sha256"])
    (item,) = api.get("/jobs").json()["items"]
    assert (item["retry_available"], api.get(f"/jobs/{job_id}").json()["retry_available"]) == (
        True,
        True,
    )
    snapshot_path(Job.objects.get(pk=job_id).snapshot_id).unlink()
    (item,) = api.get("/jobs").json()["items"]
    assert item["retry_available"] is False
    assert "snapshot was deleted" in item["retry_unavailable_reason"]
    assert api.get(f"/jobs/{job_id}").json()["retry_available"] is False


@pytest.fixture(params=["unlinked", "pruned"])
def blob_gone(request, api):
    """A FAILED job whose blob went away outside the job's deletion: by hand or by pruning."""
    sha = upload(api, tree_archive())["sha256"]
    job_id = finished_job(api, S.FAILED, snapshot=sha)
    snapshot_path(sha).unlink()
    if request.param == "pruned":
        Snapshot.objects.filter(pk=sha).update(
            deleted_at=timezone.now(), deleted_reason="with `prune_snapshots`"
        )
    return job_id, request.param


def test_a_job_whose_blob_is_gone_shows_retry_unavailable(api, blob_gone):
    job_id, _ = blob_gone
    body = api.get(f"/jobs/{job_id}").json()
    assert body["retry_available"] is False
    assert "snapshot was deleted" in body["retry_unavailable_reason"]


def test_the_reason_says_how_the_blob_went(api, blob_gone):
    job_id, how = blob_gone
    reason = api.get(f"/jobs/{job_id}").json()["retry_unavailable_reason"]
    expected = "with `prune_snapshots`" if how == "pruned" else "outside Starforge"
    assert expected in reason


def test_retry_of_a_job_whose_blob_is_gone_is_409_with_that_reason(api, blob_gone):
    job_id, _ = blob_gone
    reason = api.get(f"/jobs/{job_id}").json()["retry_unavailable_reason"]
    body = assert_refused(api.post(f"/jobs/{job_id}/retry"), 409, f"job {job_id} is FAILED", reason)
    assert "snapshot was deleted" in body["detail"]


def test_retry_of_a_job_whose_blob_is_gone_changes_nothing(api, blob_gone, kicks):
    job_id, _ = blob_gone
    before = ledger()
    retry_count = Job.objects.get(pk=job_id).retry_count
    api.post(f"/jobs/{job_id}/retry")
    assert ledger() == before
    assert Job.objects.get(pk=job_id).retry_count == retry_count
    assert kicks == []


# -- the Django admin -----------------------------------------------------------------------------


@pytest.fixture
def admin_client(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def admin_post(admin_client, django_capture_on_commit_callbacks):
    def post(path: str, data: dict):
        with django_capture_on_commit_callbacks(execute=True):
            return admin_client.post(path, data, follow=True)

    return post


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_the_admin_deletes_a_finished_job_through_the_service(api, admin_post):
    sha = upload(api, tree_archive())["sha256"]
    job_id = finished_job(api, S.FAILED, snapshot=sha)
    response = admin_post(f"/admin/jobs/job/{job_id}/delete/", {"post": "yes"})
    assert response.status_code == 200
    assert not Job.objects.filter(pk=job_id).exists()
    assert not logstore.log_path(job_id, 1).exists()
    assert not snapshot_path(sha).exists()
    assert not Snapshot.objects.filter(pk=sha).exists()


def test_the_admin_delete_page_of_a_finished_job_asks_for_confirmation(api, admin_client):
    job_id = finished_job(api, S.SUCCEEDED)
    response = admin_client.get(f"/admin/jobs/job/{job_id}/delete/")
    assert response.status_code == 200
    assert b"Are you sure" in response.content
    assert Job.objects.filter(pk=job_id).exists()


@pytest.mark.parametrize("status", BUSY)
def test_the_admin_refuses_to_delete_an_active_job_with_a_message(api, admin_post, status):
    job_id = busy_job(api, status)
    before = ledger()
    response = admin_post(f"/admin/jobs/job/{job_id}/delete/", {"post": "yes"})
    assert response.status_code == 200
    assert f"job {job_id} is {status}: stop it before deleting it" in messages_of(response)
    assert ledger() == before


def test_the_admin_bulk_delete_removes_finished_jobs_and_their_orphaned_blob(api, admin_post):
    sha = upload(api, tree_archive())["sha256"]
    ids = [finished_job(api, s, snapshot=sha) for s in (S.SUCCEEDED, S.FAILED)]
    response = admin_post(
        "/admin/jobs/job/",
        {"action": "delete_selected", "_selected_action": ids, "post": "yes"},
    )
    assert response.status_code == 200
    assert not Job.objects.filter(pk__in=ids).exists()
    assert not snapshot_path(sha).exists()
    assert not Snapshot.objects.filter(pk=sha).exists()
    assert all(not logstore.log_path(i, 1).exists() for i in ids)


def test_the_admin_bulk_delete_keeps_a_blob_another_job_still_uses(api, admin_post):
    sha = upload(api, tree_archive())["sha256"]
    gone = finished_job(api, S.SUCCEEDED, snapshot=sha)
    kept = finished_job(api, S.FAILED, snapshot=sha)
    admin_post(
        "/admin/jobs/job/", {"action": "delete_selected", "_selected_action": [gone], "post": "yes"}
    )
    assert Job.objects.filter(pk=kept).exists()
    assert snapshot_path(sha).exists()


def test_the_admin_bulk_delete_refuses_the_whole_batch_if_a_job_is_active(api, admin_post):
    done = finished_job(api, S.SUCCEEDED)
    running = busy_job(api, S.RUNNING)
    before = ledger()
    response = admin_post(
        "/admin/jobs/job/",
        {"action": "delete_selected", "_selected_action": [done, running], "post": "yes"},
    )
    assert response.status_code == 200
    (message,) = messages_of(response)
    assert f"job {running} is RUNNING: stop it before deleting it" in message
    assert ledger() == before
    assert logstore.log_path(done, 1).exists()


def test_the_admin_bulk_delete_still_shows_its_confirmation_page(api, admin_client):
    job_id = finished_job(api, S.SUCCEEDED)
    response = admin_client.post(
        "/admin/jobs/job/", {"action": "delete_selected", "_selected_action": [job_id]}
    )
    assert response.status_code == 200
    assert b"Are you sure" in response.content
    assert Job.objects.filter(pk=job_id).exists()


def metric_rows(job_id: int) -> list[int]:
    """The job's metric counters, chunks, series and rollups: rollups have no database
    constraint tying them to the job (jobs.streamed.MetricRollup.job), the cascade deletes them."""
    models = (MetricStream, MetricChunk, MetricSeries, MetricRollup)
    return [model.objects.filter(job_id=job_id).count() for model in models]


def store_points(job_id: int, first: int, n: int) -> None:
    steps = list(range(first, first + n))
    ingest.append_tracked(
        job_id, 1, ["train"] * n, ["loss"] * n, steps, [1.0] * n, [1.7e9 + s for s in steps]
    )


def test_a_deleted_jobs_metrics_go_with_it(api, remove):
    job_id = finished_job(api, S.SUCCEEDED)
    store_points(job_id, 0, 500)
    assert all(metric_rows(job_id))
    assert remove(api, job_id).status_code == 204
    assert metric_rows(job_id) == [0, 0, 0, 0]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_batch_in_flight_as_its_job_is_deleted_leaves_no_rollup_behind(api, alice):
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (run by `make test`)")
    job_id = finished_job(api, S.SUCCEEDED)
    store_points(job_id, 0, 500)  # the attempt's counter row exists (a first batch's would
    # not be seen by the deletion: its insert of the job's series fails at commit instead)
    stored, release, deleted = threading.Event(), threading.Event(), []

    def batch() -> None:  # holds its attempt's counter lock until released
        try:
            with transaction.atomic():
                store_points(job_id, 500, 500)
                stored.set()
                release.wait(10)
        finally:
            connection.close()

    def delete() -> None:
        try:
            control.delete_job(alice, job_id)
            deleted.append(True)
        finally:
            connection.close()

    writer = threading.Thread(target=batch)
    writer.start()
    assert stored.wait(10)
    deleter = threading.Thread(target=delete)
    deleter.start()
    time.sleep(0.5)  # the deletion waits on the batch's lock, not yet done
    assert not deleted
    release.set()
    writer.join()
    deleter.join()
    assert deleted == [True]
    assert not Job.objects.filter(pk=job_id).exists()
    assert metric_rows(job_id) == [0, 0, 0, 0]
