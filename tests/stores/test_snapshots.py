"""The snapshot store (POST /api/v1/snapshots): what it keeps, and everything it refuses."""

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from jobs.models import Snapshot
from jobs.stores.snapshots import SnapshotRefused, snapshot_path, store_snapshot
from tests.archives import entry, good_tree, tar_gz, upload

pytestmark = pytest.mark.django_db


def files_in(directory) -> set[Path]:
    root = Path(directory)
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()} if root.exists() else set()


@pytest.fixture
def earlier(api, settings):
    """One good snapshot stored before the request under test; returns what the store holds."""
    response = upload(api, good_tree(b"earlier"))
    assert response.status_code == 201
    return files_in(settings.SF_SNAPSHOT_DIR), Snapshot.objects.count()


def assert_refused_cleanly(response, status: int, fragment: str, earlier, settings) -> None:
    assert response.status_code == status, response.content
    detail = response.json()["detail"]
    assert isinstance(detail, str) and fragment in detail
    assert (files_in(settings.SF_SNAPSHOT_DIR), Snapshot.objects.count()) == earlier


# -- kept ------------------------------------------------------------------------------------------


def test_a_good_tree_is_stored_under_its_sha256(api):
    body = good_tree()
    response = upload(api, body)
    assert response.status_code == 201
    sha = hashlib.sha256(body).hexdigest()
    assert response.json() == {"sha256": sha, "size": len(body), "created": True}
    assert snapshot_path(sha).read_bytes() == body
    assert Snapshot.objects.get().pk == sha


def test_the_same_bytes_twice_make_one_blob_and_created_false(api, settings):
    body = good_tree()
    first = upload(api, body).json()
    second = upload(api, body)
    assert second.status_code == 201
    assert second.json() == {**first, "created": False}
    assert files_in(settings.SF_SNAPSHOT_DIR) == {
        snapshot_path(first["sha256"]).relative_to(settings.SF_SNAPSHOT_DIR)
    }
    assert Snapshot.objects.count() == 1


def test_a_blob_deleted_from_disk_is_stored_again_on_reupload(api):
    body = good_tree()
    sha = upload(api, body).json()["sha256"]
    snapshot_path(sha).unlink()
    assert upload(api, body).status_code == 201
    assert snapshot_path(sha).read_bytes() == body


def test_the_alternative_gzip_content_types_are_accepted(api):
    for n, content_type in enumerate(["application/x-gzip", "application/octet-stream"]):
        response = upload(api, good_tree(str(n).encode()), content_type)
        assert response.status_code == 201, content_type


def test_an_empty_tar_is_a_valid_snapshot(api):
    assert upload(api, tar_gz()).status_code == 201


def test_a_long_name_in_gnu_format_is_accepted(api):
    body = tar_gz(entry("d/" + "n" * 300 + ".py", b"x"), fmt=tarfile.GNU_FORMAT)
    assert upload(api, body).status_code == 201


def test_an_archive_exactly_at_the_unpacked_limit_is_accepted(api, settings):
    settings.SF_MAX_SNAPSHOT_UNPACKED_BYTES = 10_000
    assert (
        upload(api, tar_gz(entry("a", b"x" * 6_000), entry("b", b"y" * 4_000))).status_code == 201
    )


# -- refused, and nothing left behind --------------------------------------------------------------


def test_a_dot_dot_path_is_refused(api, settings, earlier):
    response = upload(api, tar_gz(entry("src/../../escape.py", b"x")))
    assert_refused_cleanly(response, 400, "unsafe path", earlier, settings)


def test_a_leading_dot_dot_path_is_refused(api, settings, earlier):
    response = upload(api, tar_gz(entry("../escape.py", b"x")))
    assert_refused_cleanly(response, 400, "unsafe path", earlier, settings)


def test_an_absolute_path_is_refused(api, settings, earlier):
    response = upload(api, tar_gz(entry("/etc/cron.d/x", b"x")))
    assert_refused_cleanly(response, 400, "unsafe path", earlier, settings)


def test_a_backslash_path_is_refused(api, settings, earlier):
    response = upload(api, tar_gz(entry("..\\..\\escape.py", b"x")))
    assert_refused_cleanly(response, 400, "unsafe path", earlier, settings)


def test_a_symlink_to_an_absolute_path_is_refused(api, settings, earlier):
    response = upload(api, tar_gz(entry("passwd", kind=tarfile.SYMTYPE, link="/etc/passwd")))
    assert_refused_cleanly(response, 400, "points outside", earlier, settings)


def test_a_symlink_climbing_out_of_the_tree_is_refused(api, settings, earlier):
    body = tar_gz(entry("a/b", kind=tarfile.SYMTYPE, link="../../home"))
    assert_refused_cleanly(upload(api, body), 400, "points outside", earlier, settings)


def test_a_member_written_through_an_archived_symlink_is_refused(api, settings, earlier):
    # s -> "." makes s/s/s the root itself, so s/s/s/l -> ../../.. escapes in reality even
    # though it looks inside when read as plain text.
    body = tar_gz(
        entry("s", kind=tarfile.SYMTYPE, link="."),
        entry("s/s/s/l", kind=tarfile.SYMTYPE, link="../../.."),
    )
    assert_refused_cleanly(upload(api, body), 400, "under its symlink", earlier, settings)


def test_a_hardlink_is_refused(api, settings, earlier):
    body = tar_gz(entry("a", b"x"), entry("b", kind=tarfile.LNKTYPE, link="a"))
    assert_refused_cleanly(upload(api, body), 400, "hard link", earlier, settings)


@pytest.mark.parametrize("kind", [tarfile.FIFOTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE])
def test_a_device_or_fifo_member_is_refused(api, settings, earlier, kind):
    body = tar_gz(entry("dev", kind=kind))
    assert_refused_cleanly(upload(api, body), 400, "device or special file", earlier, settings)


def test_a_decompression_bomb_is_refused_with_413(api, settings, earlier):
    settings.SF_MAX_SNAPSHOT_UNPACKED_BYTES = 64 * 1024
    body = tar_gz(entry("zeros.bin", b"\0" * 4 * 1024 * 1024))
    assert len(body) < 64 * 1024  # small on the wire, large unpacked
    assert_refused_cleanly(upload(api, body), 413, "unpacks to more than", earlier, settings)


def test_many_small_files_over_the_unpacked_limit_are_refused(api, settings, earlier):
    settings.SF_MAX_SNAPSHOT_UNPACKED_BYTES = 10_000
    body = tar_gz(*(entry(f"f{n}", b"x" * 1_000) for n in range(11)))
    assert_refused_cleanly(upload(api, body), 413, "unpacks to more than", earlier, settings)


def test_a_bomb_hidden_in_a_gnu_long_name_record_is_refused(api, settings, earlier):
    settings.SF_MAX_SNAPSHOT_UNPACKED_BYTES = 64 * 1024
    body = tar_gz(entry("n" * 4 * 1024 * 1024, b"x"), fmt=tarfile.GNU_FORMAT)
    assert_refused_cleanly(upload(api, body), 413, "unpacks to more than", earlier, settings)


def test_a_bomb_after_the_end_of_the_tar_is_refused(api, settings, earlier):
    settings.SF_MAX_SNAPSHOT_UNPACKED_BYTES = 64 * 1024
    tree = gzip.decompress(tar_gz(entry("a.py", b"x")))
    body = gzip.compress(tree + b"\0" * 8 * 1024 * 1024)
    assert_refused_cleanly(upload(api, body), 413, "unpacks to more than", earlier, settings)


@pytest.mark.parametrize("keep", [0.5, 0.9, -20, -8, -1])
def test_a_truncated_archive_is_refused(api, settings, earlier, keep):
    body = tar_gz(entry("weights.bin", os.urandom(30_000)), entry("b.py", b"x" * 100))
    cut = int(len(body) * keep) if keep > 0 else len(body) + keep
    assert_refused_cleanly(upload(api, body[:cut]), 400, "not a readable", earlier, settings)


def test_an_archive_with_a_corrupted_checksum_is_refused(api, settings, earlier):
    body = bytearray(tar_gz(entry("a.py", b"print(1)\n" * 50)))
    body[-6] ^= 0xFF  # inside the gzip trailer's CRC32
    assert_refused_cleanly(upload(api, bytes(body)), 400, "not a readable", earlier, settings)


def test_bytes_that_are_not_gzip_are_refused(api, settings, earlier):
    body = b"PK\x03\x04 this is a zip file, not a tarball" * 10
    assert_refused_cleanly(upload(api, body), 400, "not a readable", earlier, settings)


def test_a_gzip_that_is_not_a_tar_is_refused(api, settings, earlier):
    body = gzip.compress(b"just some text, definitely not a tar header " * 20)
    assert_refused_cleanly(upload(api, body), 400, "not a readable", earlier, settings)


def test_a_wrong_content_type_is_415(api, settings, earlier):
    response = upload(api, good_tree(b"other"), content_type="application/json")
    assert_refused_cleanly(response, 415, "application/gzip", earlier, settings)


def test_a_body_over_the_size_limit_is_413(api, settings, earlier):
    settings.SF_MAX_SNAPSHOT_BYTES = 1024
    body = tar_gz(entry("noise.bin", os.urandom(4096)))
    assert_refused_cleanly(upload(api, body), 413, "limit", earlier, settings)


def test_a_stream_over_the_size_limit_without_a_length_is_413(settings, earlier, team):
    settings.SF_MAX_SNAPSHOT_BYTES = 1024
    body = io.BytesIO(tar_gz(entry("noise.bin", os.urandom(4096))))
    with pytest.raises(SnapshotRefused) as refused:
        store_snapshot(body, "application/gzip", None, team=team)
    assert refused.value.http_status == 413
    assert (files_in(settings.SF_SNAPSHOT_DIR), Snapshot.objects.count()) == earlier


def test_an_empty_body_is_refused(api, settings, earlier):
    # The test client drops the content type of an empty body; a real client sends it.
    response = api.client.post(
        "/api/v1/snapshots", b"", content_type="application/gzip", CONTENT_TYPE="application/gzip"
    )
    assert_refused_cleanly(response, 400, "empty", earlier, settings)


def test_an_upload_without_a_token_is_401(client, settings, earlier):
    response = client.post("/api/v1/snapshots", good_tree(b"x"), content_type="application/gzip")
    assert_refused_cleanly(response, 401, "token", earlier, settings)
