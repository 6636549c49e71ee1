"""Owns getting an attempt's code in place before anything of the job runs: the snapshot
downloaded (retrying what may pass), checked against its sha256 and unpacked so that nothing
lands outside the run directory; the one-time bootstrap credential exchanged for the job token
(Ray, Kubernetes); the entrypoint found. Any failure is an `IngestError`: the runner then exits
`sf.contract.INGEST_EXIT` and the user's code never runs.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import time

from sf.http import ApiError, Client, ConnectError, retry_delay, retryable

FETCH_TRIES = 4


class IngestError(Exception):
    """Snapshot fetch/unpack or entrypoint resolution failed; the user's code must not run."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith("/") or ".." in parts:
        raise IngestError(f"unsafe path in snapshot: {name!r}")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise IngestError(f"unsupported member type in snapshot: {name!r}")
    if member.issym():
        target = os.path.normpath(os.path.join(os.path.dirname(name), member.linkname))
        if os.path.isabs(member.linkname) or target == ".." or target.startswith("../"):
            raise IngestError(f"symlink {name!r} points outside the snapshot")


def safe_unpack(archive: str, dest: str) -> None:
    """Unpack a .tar.gz into `dest`, refusing anything that could land outside it."""
    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                _check_member(member)
                _extract(tar, member, root)
        _check_links(root)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise IngestError(f"cannot unpack snapshot: {exc}") from exc


def _check_links(root: str) -> None:
    """Every symlink, now that all are in place, still resolves inside the run directory: two
    links can leave it together (`a -> c/..` with `c -> .`) though each looked inside alone."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not _inside(os.path.realpath(path), root):
                os.unlink(path)
                rel = os.path.relpath(path, root)
                raise IngestError(f"symlink {rel!r} resolves outside the run directory")


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, root: str) -> None:
    target = os.path.join(root, member.name)
    # Resolve the parent on disk: earlier in-tree symlinks could otherwise redirect us out.
    if not _inside(os.path.realpath(os.path.dirname(target)), root):
        raise IngestError(f"{member.name!r} would be written outside the run directory")
    if member.isdir():
        os.makedirs(target, exist_ok=True)
        return
    # An archive may list a file without its folders (tar does not require them).
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.lexists(target) and not os.path.isdir(target):
        os.unlink(target)
    if member.issym():
        os.symlink(member.linkname, target)
        if not _inside(os.path.realpath(target), root):
            os.unlink(target)
            raise IngestError(f"symlink {member.name!r} resolves outside the run directory")
        return
    src = tar.extractfile(member)
    assert src is not None  # regular files always have a payload
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(src, out)
    os.chmod(target, member.mode & 0o755)


def fetch_snapshot(client: Client, sha: str, dest: str, scratch: str | None = None) -> None:
    """Download the job's snapshot (retrying transient failures) and unpack it into dest.

    The archive waits in `scratch` (the attempt dir), never in the job's TMPDIR."""
    with tempfile.TemporaryDirectory(prefix="sf-ingest-", dir=scratch) as tmp:
        archive = os.path.join(tmp, "snapshot.tar.gz")
        _download(client, archive)
        if _sha256(archive) != sha:
            raise IngestError(f"snapshot checksum mismatch (expected {sha})")
        safe_unpack(archive, dest)


def _download(client: Client, archive: str) -> None:
    for attempt in range(FETCH_TRIES):
        try:
            with open(archive, "wb") as fh:
                client.download("/api/v1/ingest/snapshot", fh)
            return
        except ApiError as exc:
            if not retryable(exc) or attempt == FETCH_TRIES - 1:
                raise IngestError(f"snapshot download: HTTP {exc.status}: {exc.detail}") from exc
            time.sleep(retry_delay(exc, 2**attempt))
        except ConnectError as exc:
            if attempt == FETCH_TRIES - 1:
                raise IngestError(f"snapshot download: {exc}") from exc
            time.sleep(2**attempt)


def exchange_bootstrap(api_url: str, bootstrap: str, attempt: int, rank: int | None = None) -> str:
    """Spend the one-time bootstrap credential (Ray, Kubernetes) for the attempt's job token;
    a runner of one rank of a multi-node job (a Kubernetes pod) spends it for its rank."""
    client = Client(api_url, bootstrap)
    body = {"attempt": attempt} if rank is None else {"attempt": attempt, "rank": rank}
    for tries in range(FETCH_TRIES):
        last = tries == FETCH_TRIES - 1
        try:
            answer = client.request("POST", "/api/v1/ingest/token", json_body=body)
        except ApiError as exc:
            if not retryable(exc) or last:
                raise IngestError(f"token exchange: HTTP {exc.status}: {exc.detail}") from exc
            time.sleep(retry_delay(exc, 2**tries))
            continue
        except ConnectError as exc:
            if last:
                raise IngestError(f"token exchange: {exc}") from exc
            time.sleep(2**tries)
            continue
        token = answer.get("token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise IngestError("token exchange: the server's answer holds no token")
        return token
    raise IngestError("token exchange: no answer")  # not reached: the last try raises


def _sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_entrypoint(argv: list[str], run_dir: str, path: str | None = None) -> list[str]:
    """Check the entrypoint executable exists before spawning (a missing one is ingest)."""
    exe = argv[0]
    if "/" in exe:
        path = os.path.join(run_dir, exe)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise IngestError(f"entrypoint {exe!r} is not an executable file in the snapshot")
        return argv
    if shutil.which(exe, path=path) is None:
        raise IngestError(f"entrypoint executable {exe!r} not found on PATH")
    return argv
