"""Snapshots in object storage: stored once checked, served to the runner from the store."""

import pytest

from jobs.stores import objects
from jobs.stores.snapshots import read_project_file, snapshot_key
from tests.api_helpers import submit
from tests.archives import entry, good_tree, tar_gz, upload
from tests.ingesting import attach_attempt, runner

pytestmark = [pytest.mark.s3, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _snapshots_on_s3(on_s3):
    return on_s3


def test_a_checked_upload_is_one_object_under_its_sha256_and_no_local_file(api, settings):
    body = good_tree()
    sha = upload(api, body).json()["sha256"]
    blobs = objects.store("snapshots")
    assert blobs.keys() == [snapshot_key(sha)]
    assert blobs.open(snapshot_key(sha)).read() == body
    assert list(settings.SF_SNAPSHOT_DIR.rglob("*.tar.gz")) == []  # scratch only, and gone


def test_a_refused_upload_leaves_no_object(api):
    bad = tar_gz(entry("../escape", b"x"))
    assert upload(api, bad).status_code == 400
    assert objects.store("snapshots").keys() == []


def test_the_runner_downloads_the_jobs_snapshot_from_the_store(api):
    body = good_tree(b"runner")
    sha = upload(api, body).json()["sha256"]
    job_id = submit(api, snapshot=sha)
    attach_attempt(job_id, 1)
    response = runner(job_id).get("/api/v1/ingest/snapshot")
    assert response.status_code == 200
    assert int(response["Content-Length"]) == len(body)
    assert b"".join(response.streaming_content) == body
    objects.store("snapshots").delete(snapshot_key(sha))
    gone = runner(job_id).get("/api/v1/ingest/snapshot")
    assert gone.status_code == 410


def test_the_project_file_is_read_from_the_stored_object(api):
    body = tar_gz(entry("starforge.toml", b'[then.eval]\nentrypoint = "python eval.py"\n'))
    sha = upload(api, body).json()["sha256"]
    assert read_project_file(sha) == {"then": {"eval": {"entrypoint": "python eval.py"}}}
