"""Snapshots belong to teams (issue 12, points 7 and 10).

Before: snapshots were content-addressed and shared by everyone, so a user of another team who
knew a sha256 (it travels in job specs) ran a job on that team's code, and the upload answer's
`created` said whether anyone had uploaded those bytes. Now a job may use only a snapshot its
own team owns, another team's hash is refused exactly like an unknown one, `created` speaks
of the uploading team only, uploads need a member (not a viewer) of the team they are for,
and a team owns at most its snapshot quota.
"""

import datetime as dt
import gzip
import io
import tarfile

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobs.models import Job, Snapshot, SnapshotOwner
from jobs.stores import objects
from jobs.stores.snapshots import snapshot_stored
from tests.api_helpers import assert_refused
from tests.conftest import ApiClient

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("storage")]  # on each store


def tree(text: bytes = b"print('secret model')\n", size: int = 0) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        data = text + b"#" * size
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0, compresslevel=0 if size else 9)


def upload(api: ApiClient, body: bytes, team: str | None = None):
    path = "/api/v1/snapshots" + (f"?team={team}" if team else "")
    return api.client.post(path, body, content_type="application/gzip")


def submit(api: ApiClient, sha: str | None, team: str | None = None):
    return api.post(
        "/jobs", {"entrypoint": ["python", "train.py"], "snapshot": sha, "team": team, "gpus": 0}
    )


def files(settings) -> set[str]:
    """What the snapshot store holds, wherever SF_STORAGE_URL keeps it."""
    return set(objects.store("snapshots").keys())


@pytest.fixture
def other(make_team, make_user) -> ApiClient:
    """bob, in another team (nlp), who learnt the hash of vision's snapshot."""
    return ApiClient(make_user("bob", make_team("nlp")))


@pytest.fixture
def secret(api) -> str:
    """vision's snapshot, uploaded by alice."""
    response = upload(api, tree())
    assert response.status_code == 201, response.content
    return response.json()["sha256"]


def finish(job_id: int, ended_days_ago: float = 0) -> None:
    Job.objects.filter(pk=job_id).update(
        status="SUCCEEDED", status_changed_at=timezone.now() - dt.timedelta(days=ended_days_ago)
    )


# -- point 7: using another team's snapshot ------------------------------------------------------


def test_another_teams_hash_is_refused_exactly_like_an_unknown_one(api, other, secret):
    foreign = submit(other, secret)
    unknown = submit(other, "0" * 64)
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json()["detail"].replace(secret, "X") == unknown.json()["detail"].replace(
        "0" * 64, "X"
    )
    assert "unknown" in foreign.json()["detail"]
    assert not Job.objects.filter(user__username="bob").exists()
    # The owner's team still runs it.
    assert submit(api, secret).status_code == 201


def test_the_upload_answer_says_nothing_about_other_teams(api, other, secret, settings):
    # bob's team never had these bytes: created, as if nobody had.
    first = upload(other, tree())
    assert first.status_code == 201
    assert first.json() == {"sha256": secret, "size": len(tree()), "created": True}
    assert upload(other, tree()).json()["created"] is False  # now nlp has it
    assert upload(api, tree()).json()["created"] is False
    # One blob underneath, two claims; bob's team may now run it.
    assert len(files(settings)) == 1
    assert SnapshotOwner.objects.filter(snapshot_id=secret).count() == 2
    assert submit(other, secret).status_code == 201


def test_a_follow_on_and_a_retry_keep_using_the_teams_snapshot(api, secret):
    response = submit(api, secret)
    job = Job.objects.get(pk=response.json()["id"])
    finish(job.pk)
    Job.objects.filter(pk=job.pk).update(status="FAILED")
    assert api.post(f"/jobs/{job.pk}/retry").status_code == 200


def test_the_ingest_download_serves_only_the_jobs_own_snapshot(api, secret):
    from tests.ingesting import attach_attempt, runner

    job_id = submit(api, secret).json()["id"]
    attach_attempt(job_id, 1)
    response = runner(job_id).get("/api/v1/ingest/snapshot")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == tree()


# -- who may upload ------------------------------------------------------------------------------


def test_a_viewer_cannot_upload(make_team, make_user, settings):
    viewer = ApiClient(make_user("vera", make_team("vision"), role="viewer"))
    assert_refused(upload(viewer, tree()), 403, "viewer")
    assert_refused(upload(viewer, tree(), team="vision"), 403, "viewer")
    assert files(settings) == set() and not Snapshot.objects.exists()


def test_an_outsider_cannot_upload_for_a_team(other, api, settings):
    assert_refused(upload(other, tree(), team="vision"), 403, "not a member of team 'vision'")
    assert files(settings) == set() and not Snapshot.objects.exists()


def test_a_user_without_a_team_cannot_upload(make_user, db, settings):
    assert_refused(upload(ApiClient(make_user("nobody")), tree()), 403, "no team")
    assert files(settings) == set()


def test_a_member_of_two_teams_must_say_which_and_the_claim_is_that_teams(
    make_team, make_user, settings
):
    vision, nlp = make_team("vision"), make_team("nlp")
    carol = make_user("carol", vision)
    from jobs.models import Membership

    Membership.objects.create(team=nlp, user=carol, role="member")
    client = ApiClient(carol)
    assert_refused(upload(client, tree()), 400, "?team=", "nlp", "vision")
    assert files(settings) == set()
    response = upload(client, tree(), team="nlp")
    assert response.status_code == 201
    sha = response.json()["sha256"]
    assert list(SnapshotOwner.objects.values_list("team__name", "uploaded_by__username")) == [
        ("nlp", "carol")
    ]
    assert submit(client, sha, team="vision").status_code == 404
    assert submit(client, sha, team="nlp").status_code == 201


def test_a_viewer_elsewhere_uploads_by_default_to_the_team_they_can(make_team, make_user):
    vision, nlp = make_team("vision"), make_team("nlp")
    dan = make_user("dan", vision)
    from jobs.models import Membership

    Membership.objects.create(team=nlp, user=dan, role="viewer")
    assert upload(ApiClient(dan), tree()).status_code == 201
    assert list(SnapshotOwner.objects.values_list("team__name", flat=True)) == ["vision"]


# -- deletion ------------------------------------------------------------------------------------


def test_a_claim_goes_with_the_teams_last_job_and_the_blob_with_the_last_claim(api, other, secret):
    upload(other, tree())
    mine = [submit(api, secret).json()["id"] for _ in range(2)]
    theirs = submit(other, secret).json()["id"]
    for job_id in [*mine, theirs]:
        finish(job_id)
    assert api.client.delete(f"/api/v1/jobs/{mine[0]}").status_code == 204
    assert set(SnapshotOwner.objects.values_list("team__name", flat=True)) == {"vision", "nlp"}
    assert api.client.delete(f"/api/v1/jobs/{mine[1]}").status_code == 204
    assert list(SnapshotOwner.objects.values_list("team__name", flat=True)) == ["nlp"]
    assert snapshot_stored(secret)  # nlp still owns and uses it
    assert submit(api, secret).status_code == 404  # vision's claim is gone
    assert other.client.delete(f"/api/v1/jobs/{theirs}").status_code == 204
    assert not snapshot_stored(secret)
    assert not Snapshot.objects.filter(pk=secret).exists()


def test_an_unused_claim_of_another_team_keeps_the_blob(api, other, secret):
    upload(other, tree())  # nlp owns it but has no job with it
    job_id = submit(api, secret).json()["id"]
    finish(job_id)
    assert api.client.delete(f"/api/v1/jobs/{job_id}").status_code == 204
    assert snapshot_stored(secret)
    assert submit(other, secret).status_code == 201


def test_prune_removes_every_claim_and_a_reupload_revives_the_snapshot(api, secret):
    job_id = submit(api, secret).json()["id"]
    finish(job_id, ended_days_ago=10)
    call_command("prune_snapshots", "--older-than", "7")
    assert not snapshot_stored(secret)
    assert not SnapshotOwner.objects.exists()
    assert Snapshot.objects.get(pk=secret).deleted_reason  # the retry can say why
    again = upload(api, tree())
    assert again.status_code == 201 and again.json()["created"] is True
    assert Snapshot.objects.get(pk=secret).deleted_at is None
    assert submit(api, secret).status_code == 201


def test_prune_keeps_a_fresh_upload_no_job_uses_yet(api, secret):
    call_command("prune_snapshots", "--older-than", "1")
    assert snapshot_stored(secret)
    Snapshot.objects.filter(pk=secret).update(created_at=timezone.now() - dt.timedelta(days=3))
    call_command("prune_snapshots", "--older-than", "1")
    assert not snapshot_stored(secret)


def test_prune_works_while_some_job_has_no_snapshot(api, secret):
    from tests.api_helpers import submit as submit_plain

    submit_plain(api)  # a QUEUED job without a snapshot: a NULL in the still-needed list
    job_id = submit(api, secret).json()["id"]
    finish(job_id, ended_days_ago=10)
    call_command("prune_snapshots", "--older-than", "7")
    assert not snapshot_stored(secret)


# -- point 10: the team's snapshot quota ---------------------------------------------------------


def test_an_upload_past_the_teams_quota_is_413_naming_the_numbers(api, team, settings):
    team.snapshot_quota_mb = 1
    team.save()
    first = upload(api, tree(b"a", size=600_000))
    assert first.status_code == 201
    before = (files(settings), Snapshot.objects.count(), SnapshotOwner.objects.count())
    body = assert_refused(
        upload(api, tree(b"b", size=600_000)), 413, "quota is 1 MiB", "team vision"
    )
    assert "0.6 MiB" in body["detail"]
    assert (files(settings), Snapshot.objects.count(), SnapshotOwner.objects.count()) == before
    # Sending what the team already owns costs nothing and is accepted at the cap.
    assert upload(api, tree(b"a", size=600_000)).json()["created"] is False


def test_a_shared_blob_counts_against_each_team_that_owns_it(api, other, team, settings):
    from jobs.models import Team

    Team.objects.filter(name="nlp").update(snapshot_quota_mb=1)
    assert upload(api, tree(b"big", size=1_200_000)).status_code == 201  # vision: 10 GiB
    assert_refused(upload(other, tree(b"big", size=1_200_000)), 413, "team nlp")
    assert SnapshotOwner.objects.count() == 1


def test_a_declared_size_over_the_whole_quota_is_refused_before_reading(api, team, settings):
    team.snapshot_quota_mb = 1
    team.save()
    body = tree(b"c", size=1_500_000)
    assert_refused(upload(api, body), 413, "quota is 1 MiB")
    assert files(settings) == set()


def test_the_quota_is_editable_in_the_admin():
    from django.contrib import admin

    from jobs.models import Team

    fields = [f for _, opts in admin.site._registry[Team].fieldsets for f in opts["fields"]]
    assert "snapshot_quota_mb" in fields
    assert Team._meta.get_field("snapshot_quota_mb").default == 10240


@pytest.mark.django_db(transaction=True)
def test_two_uploads_at_once_cannot_both_pass_the_quota(make_team, make_user, settings):
    import threading

    from django.db import connections

    from jobs.stores.snapshots import SnapshotRefused, store_snapshot

    team = make_team("vision")
    team.snapshot_quota_mb = 1
    team.save()
    barrier, outcomes = threading.Barrier(4), []

    def send(n: int) -> None:
        body = tree(str(n).encode(), size=600_000)
        try:
            barrier.wait()
            store_snapshot(io.BytesIO(body), "application/gzip", None, team=team)
            outcomes.append("stored")
        except SnapshotRefused as exc:
            outcomes.append(exc.http_status)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes, key=str) == [413, 413, 413, "stored"]
    assert SnapshotOwner.objects.count() == 1 and len(files(settings)) == 1
