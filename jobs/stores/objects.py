"""Where snapshots and logs keep their bytes: a local directory or S3-compatible object storage.

One URL in the environment, `SF_STORAGE_URL`, says which (parsed at start-up by
`starforge.settings`; a URL this module cannot use stops the server with a sentence):

- unset or empty: local directories, SF_SNAPSHOT_DIR and SF_LOG_DIR under SF_VAR_DIR (the
  embedded default, what `make run` uses);
- ``file:///abs/path``: local directories ``/abs/path/snapshots`` and ``/abs/path/logs``;
- ``s3://bucket/prefix?endpoint=http://host:9000&region=us-east-1``: objects under
  ``prefix/snapshots/`` and ``prefix/logs/`` of the bucket, which must exist. `endpoint` (any
  S3-compatible server; path-style addressing then) and `region` are optional. Credentials are
  the URL's ``s3://KEY:SECRET@bucket`` (percent-encoded) or, without them, boto3's own chain
  (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, an instance role).

Every server host must see the same storage: with a local directory that means one host (or a
shared filesystem); with object storage any number of hosts. Object storage cannot append, so
the log store keeps a running attempt's recent batches in the ledger and moves them here in
whole segments (`jobs.stores.logstore`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

PART_BYTES = 8 * 1024 * 1024  # of a multipart upload (S3 wants at least 5 MiB but the last)


class StorageUrlInvalid(ImproperlyConfigured):
    """SF_STORAGE_URL cannot be used; the message says why and what would do."""


class ObjectMissing(Exception):
    """The object is not (or no longer) in the store."""


@dataclass(frozen=True)
class StorageLocation:
    kind: str  # "file" or "s3"
    root: Path | None = None  # file: the directory holding snapshots/ and logs/ (None: defaults)
    bucket: str = ""
    prefix: str = ""  # s3: ends with "/" unless empty
    endpoint: str | None = None
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)


def parse_storage_url(url: str) -> StorageLocation:
    """The location `url` names, or StorageUrlInvalid saying what is wrong with it."""
    url = url.strip()
    if not url:
        return StorageLocation("file")
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise StorageUrlInvalid(
                f"SF_STORAGE_URL {url!r}: a local directory is file:///absolute/path"
            )
        if parts.query:
            raise StorageUrlInvalid(f"SF_STORAGE_URL {url!r}: file:// URLs take no options")
        return StorageLocation("file", root=Path(unquote(parts.path)))
    if parts.scheme == "s3":
        return _s3_location(url, parts)
    raise StorageUrlInvalid(
        f"SF_STORAGE_URL {url!r}: the scheme must be file:// (a local directory) or s3:// "
        "(S3-compatible object storage)"
    )


def _s3_location(url: str, parts) -> StorageLocation:
    bucket = parts.hostname or ""
    if not bucket:
        raise StorageUrlInvalid(f"SF_STORAGE_URL {url!r}: name the bucket, s3://bucket/prefix")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - {"endpoint", "region"})
    if unknown:
        raise StorageUrlInvalid(
            f"SF_STORAGE_URL {url!r}: unknown option(s) {', '.join(unknown)}; "
            "s3:// URLs take endpoint and region"
        )
    endpoint = options.get("endpoint") or None
    if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
        raise StorageUrlInvalid(
            f"SF_STORAGE_URL {url!r}: endpoint must be an http:// or https:// URL"
        )
    if (parts.username is None) != (parts.password is None):
        raise StorageUrlInvalid(f"SF_STORAGE_URL {url!r}: credentials are KEY:SECRET@bucket")
    prefix = parts.path.strip("/")
    return StorageLocation(
        "s3",
        bucket=bucket,
        prefix=f"{prefix}/" if prefix else "",
        endpoint=endpoint,
        region=options.get("region") or None,
        access_key=unquote(parts.username) if parts.username is not None else None,
        secret_key=unquote(parts.password) if parts.password is not None else None,
    )


class ObjectStore(Protocol):
    """Whole objects under string keys; no appends, no renames (what S3 offers)."""

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def put_file(self, key: str, path: Path) -> None:
        """The file becomes the object; the file may be gone afterwards."""

    def put_stream(self, key: str, stream: IO[bytes]) -> None: ...

    def open(self, key: str) -> IO[bytes]:
        """A reader of the whole object (ObjectMissing if there is none)."""

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object (ObjectMissing if there is none)."""

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int:
        """Its size in bytes (ObjectMissing if there is none)."""

    def delete(self, key: str) -> None:
        """Gone afterwards, whether it was there or not."""

    def delete_prefix(self, prefix: str) -> None:
        """Every object under the folder `prefix` ("a/b/") gone."""

    def keys(self, prefix: str = "") -> list[str]:
        """The keys of the objects under the folder `prefix`, sorted."""


class LocalStore:
    """Objects as files under a directory; a key's slashes are subdirectories."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key

    def put_bytes(self, key: str, data: bytes) -> None:
        target = self._parent_made(key)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, target)

    def put_file(self, key: str, path: Path) -> None:
        target = self._parent_made(key)
        try:
            os.replace(path, target)
        except OSError:  # another filesystem: copy, then replace atomically
            self.put_stream(key, open(path, "rb"))

    def put_stream(self, key: str, stream: IO[bytes]) -> None:
        target = self._parent_made(key)
        with stream, tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
            shutil.copyfileobj(stream, tmp, 1024 * 1024)
        os.replace(tmp.name, target)

    def open(self, key: str) -> IO[bytes]:
        try:
            return open(self.path(key), "rb")
        except FileNotFoundError:
            raise ObjectMissing(key) from None

    def read_range(self, key: str, start: int, end: int) -> bytes:
        with self.open(key) as handle:
            handle.seek(start)
            return handle.read(end - start)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            raise ObjectMissing(key) from None

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> None:
        shutil.rmtree(self.path(prefix), ignore_errors=True)

    def keys(self, prefix: str = "") -> list[str]:
        top = self.path(prefix)
        found = (p for p in top.rglob("*") if p.is_file()) if top.is_dir() else ()
        return sorted(p.relative_to(self.root).as_posix() for p in found)

    def _parent_made(self, key: str) -> Path:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        return target


class S3Store:
    """Objects in one bucket under a prefix, through boto3 (thread-safe, pooled connections)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client, self.bucket, self.prefix = client, bucket, prefix

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def put_file(self, key: str, path: Path) -> None:
        self.client.upload_file(str(path), self.bucket, self.prefix + key)

    def put_stream(self, key: str, stream: IO[bytes]) -> None:
        """Read in the caller's thread, part by part (boto3's upload_fileobj would read in its
        own threads, and a reader that queries the ledger would leave a connection in each)."""
        with stream:
            part = stream.read(PART_BYTES)
            following = stream.read(PART_BYTES) if len(part) == PART_BYTES else b""
            if not following:
                self.put_bytes(key, part)
                return
            self._put_parts(key, [part, following], stream)

    def _put_parts(self, key: str, first: list[bytes], stream: IO[bytes]) -> None:
        name = {"Bucket": self.bucket, "Key": self.prefix + key}
        upload = self.client.create_multipart_upload(**name)["UploadId"]
        try:
            parts: list[dict] = []
            pending = first
            while pending:
                number = len(parts) + 1
                sent = self.client.upload_part(
                    **name, UploadId=upload, PartNumber=number, Body=pending.pop(0)
                )
                parts.append({"ETag": sent["ETag"], "PartNumber": number})
                if not pending and (more := stream.read(PART_BYTES)):
                    pending.append(more)
            self.client.complete_multipart_upload(
                **name, UploadId=upload, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            self.client.abort_multipart_upload(**name, UploadId=upload)
            raise

    def open(self, key: str) -> IO[bytes]:
        return self._get(key)["Body"]

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        body = self._get(key, Range=f"bytes={start}-{end - 1}")["Body"]
        with body:
            return body.read()

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except ObjectMissing:
            return False
        return True

    def size(self, key: str) -> int:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except ClientError as exc:
            if _missing(exc):
                raise ObjectMissing(key) from None
            raise
        return head["ContentLength"]

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.prefix + key)

    def delete_prefix(self, prefix: str) -> None:
        keys = self.keys(prefix)
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1000 at most
            batch = [{"Key": self.prefix + key} for key in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix
        )
        return sorted(
            item["Key"].removeprefix(self.prefix)
            for page in pages
            for item in page.get("Contents", [])
        )

    def _get(self, key: str, **extra) -> dict:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.prefix + key, **extra)
        except ClientError as exc:
            if _missing(exc):
                raise ObjectMissing(key) from None
            raise


def _missing(exc) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


def location() -> StorageLocation:
    return settings.SF_STORAGE


def is_local() -> bool:
    """Whether the bytes live in local directories (appendable files) rather than objects."""
    return location().kind == "file"


def store(area: str) -> LocalStore | S3Store:
    """The store of one area ("snapshots" or "logs") where SF_STORAGE_URL says."""
    where = location()
    if where.kind == "file":
        root = settings.SF_SNAPSHOT_DIR if area == "snapshots" else settings.SF_LOG_DIR
        return LocalStore(Path(root))
    return S3Store(_s3_client(where), where.bucket, f"{where.prefix}{area}/")


@lru_cache(maxsize=4)
def _s3_client(where: StorageLocation) -> Any:
    """One client per location: making one costs tens of milliseconds, using one is thread-safe."""
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": "path" if where.endpoint else "auto"},
        retries={"max_attempts": 5, "mode": "standard"},
        max_pool_connections=32,
        # Checksums only where S3 requires them: S3-compatible servers answer a ranged GET
        # with the whole object's checksum, which botocore would refuse.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=where.endpoint,
        region_name=where.region,
        aws_access_key_id=where.access_key,
        aws_secret_access_key=where.secret_key,
        config=config,
    )
