"""The storage interface on both backends, and the URL that picks one."""

import io

import pytest

from jobs.stores import objects
from jobs.stores.objects import LocalStore, ObjectMissing, StorageUrlInvalid, parse_storage_url


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    request.getfixturevalue("on_s3")
    return objects.store("logs")


def test_put_get_range_size_and_delete_round_trip(store, tmp_path):
    store.put_bytes("a/b/1", b"hello world")
    assert store.exists("a/b/1")
    assert store.size("a/b/1") == 11
    assert store.read_range("a/b/1", 6, 11) == b"world"
    with store.open("a/b/1") as handle:
        assert handle.read() == b"hello world"
    store.delete("a/b/1")
    assert not store.exists("a/b/1")
    store.delete("a/b/1")  # gone already: no error


def test_a_missing_object_raises_object_missing(store):
    with pytest.raises(ObjectMissing):
        store.open("nope")
    with pytest.raises(ObjectMissing):
        store.read_range("nope", 0, 1)
    with pytest.raises(ObjectMissing):
        store.size("nope")


def test_files_and_streams_become_objects_multipart_included(store, tmp_path):
    big = bytes(range(256)) * (40 * 1024)  # 10 MiB: boto3 uploads it in parts
    source = tmp_path / "big"
    source.write_bytes(big)
    store.put_file("f", source)
    store.put_stream("s", io.BytesIO(big))
    assert store.size("f") == store.size("s") == len(big)
    assert store.read_range("s", len(big) - 5, len(big)) == big[-5:]


def test_delete_prefix_removes_that_folder_only(store):
    for key in ("12/1/0-5", "12/2/0-5", "123/1/0-5"):
        store.put_bytes(key, b"x")
    store.delete_prefix("12/")
    assert [store.exists(k) for k in ("12/1/0-5", "12/2/0-5", "123/1/0-5")] == [
        False,
        False,
        True,
    ]


def test_an_empty_url_is_the_local_default():
    assert parse_storage_url("") == objects.StorageLocation("file")


def test_a_file_url_names_the_directory_of_both_areas():
    assert parse_storage_url("file:///srv/sf").root.as_posix() == "/srv/sf"


def test_an_s3_url_carries_bucket_prefix_endpoint_region_and_credentials():
    where = parse_storage_url(
        "s3://AK:s%2Fcret@logs-bucket/sf/prod/?endpoint=http://127.0.0.1:9000&region=eu-west-1"
    )
    assert (where.bucket, where.prefix, where.endpoint, where.region) == (
        "logs-bucket",
        "sf/prod/",
        "http://127.0.0.1:9000",
        "eu-west-1",
    )
    assert (where.access_key, where.secret_key) == ("AK", "s/cret")
    assert "s/cret" not in repr(where)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://host/x", "scheme must be file://"),
        ("file://relative/path", "file:///absolute/path"),
        ("s3:///prefix", "name the bucket"),
        ("s3://b/p?endpoint=127.0.0.1:9000", "http:// or https://"),
        ("s3://b/p?bucket=x", "unknown option(s) bucket"),
        ("s3://KEY@b/p", "KEY:SECRET@bucket"),
    ],
)
def test_a_url_that_cannot_work_is_refused_with_a_sentence(url, says):
    with pytest.raises(StorageUrlInvalid, match=None) as refused:
        parse_storage_url(url)
    assert says in str(refused.value)


def test_a_bad_url_stops_the_start_up(tmp_path):
    import subprocess
    import sys

    env = {"SF_STORAGE_URL": "s3://", "SF_VAR_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", "import starforge.settings"],
        env=env,
        capture_output=True,
        text=True,
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]),
    )
    assert done.returncode != 0
    assert "SF_STORAGE_URL 's3://': name the bucket" in done.stderr
