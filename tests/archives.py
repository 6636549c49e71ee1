"""Snapshot archives built by hand for the tests of the snapshot store and its refusals: any tar
member in any format, gzipped; a good tree; an upload of raw bytes to the snapshots API."""

import gzip
import io
import tarfile


def entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    if kind == tarfile.REGTYPE:
        info.size = len(data)
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def tar_gz(*entries, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tar:
        for info, data in entries:
            tar.addfile(info, data)
    return gzip.compress(raw.getvalue(), mtime=0)


def good_tree(seed: bytes = b"") -> bytes:
    return tar_gz(
        entry("src", kind=tarfile.DIRTYPE),
        entry("src/train.py", b"print('hi')\n" + seed),
        entry("README.md", b"# model\n"),
        entry("latest", kind=tarfile.SYMTYPE, link="src/train.py"),
        entry("src/up", kind=tarfile.SYMTYPE, link="../README.md"),
    )


def upload(api, body: bytes, content_type: str = "application/gzip"):
    return api.client.post("/api/v1/snapshots", body, content_type=content_type)
