"""Working-directory snapshots: content-addressed tar.gz files, checked before they are kept.

An upload is streamed to a temporary file while it is hashed, then opened as a tar stream and
refused unless every member is a plain file, directory or a symlink that stays inside the tree
(followed through the archive's other symlinks too), with safe relative names, under the
unpacked-size and member-count caps (a decompression bomb or a truncated archive ends in a
refusal, not in a half-written store).

Snapshots belong to teams. The bytes are stored once per sha256 whoever sends them; each team
whose member uploaded them owns them through a `SnapshotOwner` row, and only a team's own
snapshots can run its jobs. An upload's `created` says whether THIS team owned the content
before, never whether another team has it. A team owns at most `Team.snapshot_quota_mb` MiB
of snapshots (the sum of their sizes); an upload past it is refused with a 413 and nothing
is stored.

The blobs live where SF_STORAGE_URL says (`jobs.stores.objects`): SF_SNAPSHOT_DIR by default,
or object storage shared by every server host. An upload is checked in a local scratch file
(under SF_SNAPSHOT_DIR) and only then placed in the store, under the same locks either way:
they serialise the team's own uploads and the deletion of jobs using the same bytes, and
nothing else (no admission, no ingest) waits on them.
"""

import gzip
import hashlib
import os
import posixpath
import tarfile
import tempfile
import tomllib
import zlib
from collections import deque
from pathlib import Path
from typing import IO, BinaryIO

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from jobs.models import Snapshot, SnapshotOwner, Team
from jobs.stores import objects

MAX_MEMBERS = 200_000
# Decompressed bytes allowed beyond the members' declared sizes: headers, long-name and pax
# records, padding, the end-of-archive record. Anything more is data nobody will unpack.
HEADROOM_BYTES = 1024 * 1024
MEMBER_OVERHEAD_BYTES = 4096
MAX_LINK_HOPS = 40  # Linux's limit on symlinks followed in one path
# Path characters looked up to follow every symlink of one archive: a real tree needs a few
# dozen per link; chains of long links through links would otherwise cost minutes of CPU.
MAX_LINK_WALK_CHARS = 64 * 1024 * 1024
ACCEPTED_TYPES = {
    "application/gzip",
    "application/x-gzip",
    "application/x-tar+gzip",
    "application/octet-stream",
}


class SnapshotRefused(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.http_status = status


def snapshot_key(sha256: str) -> str:
    return f"{sha256[:2]}/{sha256}.tar.gz"


def snapshot_path(sha256: str) -> Path:
    """Where the local directory backend keeps the blob (what an operator looks at)."""
    return Path(settings.SF_SNAPSHOT_DIR) / snapshot_key(sha256)


def snapshot_stored(sha256: str) -> bool:
    return objects.store("snapshots").exists(snapshot_key(sha256))


def open_snapshot(sha256: str) -> IO[bytes]:
    """A reader of the stored blob; objects.ObjectMissing when it is gone."""
    return objects.store("snapshots").open(snapshot_key(sha256))


def delete_blob(sha256: str) -> None:
    objects.store("snapshots").delete(snapshot_key(sha256))


def store_snapshot(
    body: BinaryIO,
    content_type: str,
    declared_size: int | None,
    *,
    team: Team,
    user: User | None = None,
) -> tuple[Snapshot, bool]:
    """Validate and keep an uploaded archive for `team`; returns the row and whether the team
    did not own it before (other teams' snapshots never show in the answer)."""
    limit = settings.SF_MAX_SNAPSHOT_BYTES
    if content_type.split(";")[0].strip() not in ACCEPTED_TYPES:
        raise SnapshotRefused(
            f"a snapshot must be sent as application/gzip (a .tar.gz), not {content_type!r}", 415
        )
    if declared_size is not None and declared_size > limit:
        raise SnapshotRefused(_too_big(declared_size, limit), 413)
    quota = team.snapshot_quota_mb * 2**20
    if declared_size is not None and declared_size > quota:
        raise SnapshotRefused(_over_quota(team, declared_size, 0), 413)  # could never fit
    Path(settings.SF_SNAPSHOT_DIR).mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=settings.SF_SNAPSHOT_DIR, delete=False) as tmp:
        try:
            sha, size = _copy_hashing(body, tmp, limit)
            tmp.flush()
            validate_archive(tmp.name)
        except BaseException:
            os.unlink(tmp.name)
            raise
    try:
        return _keep(tmp.name, sha, size, team, user)
    finally:
        if os.path.exists(tmp.name):
            os.unlink(tmp.name)  # refused, or the blob was already stored


def _copy_hashing(body: BinaryIO, out, limit: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := body.read(1024 * 1024):
        size += len(chunk)
        if size > limit:
            raise SnapshotRefused(_too_big(size, limit), 413)
        digest.update(chunk)
        out.write(chunk)
    if size == 0:
        raise SnapshotRefused("the snapshot is empty; send the working directory as a .tar.gz")
    return digest.hexdigest(), size


def _keep(
    tmp_name: str, sha: str, size: int, team: Team, user: User | None
) -> tuple[Snapshot, bool]:
    """Claim the content for the team, under its quota, and place the blob if it is missing.

    The team row is locked (FOR NO KEY UPDATE: a job insert's key-share lock on it does not
    wait) so two uploads cannot both pass the quota, then the snapshot row, which job deletion
    locks before it removes the blob, so the blob placed here is not removed under the claim.
    """
    with transaction.atomic():
        team = Team.objects.select_for_update(no_key=True).get(pk=team.pk)
        snapshot = _locked_row(sha, size)
        blobs, key = objects.store("snapshots"), snapshot_key(sha)
        stored = blobs.exists(key)
        owned = (
            snapshot.deleted_at is None
            and stored
            and SnapshotOwner.objects.filter(team=team, snapshot=snapshot).exists()
        )
        if not owned:
            used = team_snapshot_bytes(team, excluding=sha)
            if used + size > team.snapshot_quota_mb * 2**20:
                raise SnapshotRefused(_over_quota(team, size, used), 413)
        if not stored:  # else the same content is already stored: one blob for all teams
            blobs.put_file(key, Path(tmp_name))
        if snapshot.deleted_at is not None:  # pruned earlier, uploaded again
            Snapshot.objects.filter(pk=sha).update(deleted_at=None, deleted_reason="")
            snapshot.deleted_at, snapshot.deleted_reason = None, ""
        SnapshotOwner.objects.get_or_create(
            team=team,
            snapshot=snapshot,
            defaults={"uploaded_by": user, "created_at": timezone.now()},
        )
    return snapshot, not owned


def _locked_row(sha: str, size: int) -> Snapshot:
    """The snapshot row, made if missing, locked; a deletion committing meanwhile means again."""
    for _ in range(5):
        Snapshot.objects.get_or_create(sha256=sha, defaults={"size": size})
        snapshot = Snapshot.objects.select_for_update().filter(pk=sha).first()
        if snapshot is not None:
            return snapshot
    raise SnapshotRefused("the snapshot was being deleted while it was stored; send it again", 409)


def team_snapshot_bytes(team: Team, excluding: str | None = None) -> int:
    """The sum of the sizes of the snapshots the team owns (what its quota counts)."""
    owned = SnapshotOwner.objects.filter(team=team, snapshot__deleted_at__isnull=True)
    if excluding is not None:
        owned = owned.exclude(snapshot_id=excluding)
    return owned.aggregate(total=Sum("snapshot__size"))["total"] or 0


def owned_snapshot(team: Team | int, sha: str) -> Snapshot | None:
    """The team's own stored snapshot `sha`, row-locked, or None: unknown, another team's, or
    its blob gone (the caller answers all three alike)."""
    snapshot = Snapshot.objects.select_for_update().filter(pk=sha).first()
    if (
        snapshot is None
        or snapshot.deleted_at is not None
        or not SnapshotOwner.objects.filter(team=team, snapshot=snapshot).exists()
        or not snapshot_stored(sha)
    ):
        return None
    return snapshot


def release_claim(team_id: int, snapshot: Snapshot) -> bool:
    """Drop the team's claim if none of its jobs uses the snapshot any more; then delete the
    row and blob if no team owns it and no job references it. Call with the snapshot row
    locked, inside the transaction that removed the job. Returns whether the blob went."""
    from jobs.models import Job

    if not Job.objects.filter(team_id=team_id, snapshot=snapshot).exists():
        SnapshotOwner.objects.filter(team_id=team_id, snapshot=snapshot).delete()
    if SnapshotOwner.objects.filter(snapshot=snapshot).exists():
        return False
    if Job.objects.filter(snapshot=snapshot).exists():
        return False
    Snapshot.objects.filter(pk=snapshot.pk).delete()
    # Under the row lock, not after commit: an upload of the same bytes waits on that lock,
    # then finds no row and places its own blob, which a late unlink would remove.
    delete_blob(snapshot.sha256)
    return True


def _over_quota(team: Team, size: int, used: int) -> str:
    quota = team.snapshot_quota_mb
    return (
        f"team {team.name} owns {used / 2**20:.1f} MiB of snapshots and its quota is "
        f"{quota} MiB; this {size / 2**20:.1f} MiB snapshot does not fit (delete old jobs, "
        "or ask staff to raise snapshot_quota_mb)"
    )


def validate_archive(path: str) -> None:
    """Refuse the archive unless it is a complete gzip stream of a tar of safe members.

    Decompressed bytes are counted as they are read, so a bomb hidden in a long-name or pax
    record, or in bytes after the end of the tar, is refused before it is inflated; reading
    the gzip stream to its end checks its length and CRC, so a truncated upload is refused.
    """
    unpacked_limit = settings.SF_MAX_SNAPSHOT_UNPACKED_BYTES
    total = members = 0
    links: dict[str, str] = {}
    try:
        with gzip.open(path, "rb") as raw:
            stream = _CountingReader(raw, unpacked_limit)
            with tarfile.open(fileobj=stream, mode="r|") as archive:  # type: ignore[call-overload]
                for member in archive:
                    members += 1
                    total += member.size if member.isfile() else 0
                    if members > MAX_MEMBERS or total > unpacked_limit:
                        raise SnapshotRefused(_too_big_unpacked(unpacked_limit), 413)
                    stream.allowed = HEADROOM_BYTES + total + members * MEMBER_OVERHEAD_BYTES
                    check_member(member)
                    _check_not_under_symlink(member, links)
            while stream.read(1024 * 1024):
                pass
        _check_links_resolve_inside(links)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise SnapshotRefused(f"the snapshot is not a readable .tar.gz ({exc})") from exc


class _CountingReader:
    """A file-like view of the decompressed stream that refuses bytes past `allowed`."""

    def __init__(self, raw: gzip.GzipFile, unpacked_limit: int) -> None:
        self.raw, self.unpacked_limit = raw, unpacked_limit
        self.seen, self.allowed = 0, HEADROOM_BYTES

    def read(self, size: int) -> bytes:
        data = self.raw.read(size)
        self.seen += len(data)
        if self.seen > self.allowed:
            raise SnapshotRefused(_too_big_unpacked(self.unpacked_limit), 413)
        return data


def _too_big_unpacked(limit: int) -> str:
    return (
        f"the snapshot unpacks to more than {limit / 2**20:.1f} MiB or {MAX_MEMBERS} files; "
        "refusing it"
    )


def _check_not_under_symlink(member: tarfile.TarInfo, links: dict[str, str]) -> None:
    """A member below a symlink of the same archive would be written wherever the link points."""
    parts = posixpath.normpath(member.name).split("/")
    for depth in range(1, len(parts)):
        parent = "/".join(parts[:depth])
        if parent in links:
            raise SnapshotRefused(
                f"the snapshot's member {member.name!r} lies under its symlink {parent!r}; "
                "paths must stay inside the working directory"
            )
    if member.issym():
        links[posixpath.normpath(member.name)] = member.linkname


def _check_links_resolve_inside(links: dict[str, str]) -> None:
    """Refuse a symlink that leaves the tree once the archive's other symlinks are followed.

    Each target stays inside when read as text, but `a -> c/..` with `c -> .` is the tree's
    parent: whichever order they are unpacked in, the pair points outside.
    """
    budget = MAX_LINK_WALK_CHARS
    for name, target in links.items():
        inside, cost = _resolves_inside(posixpath.dirname(name), target, links, budget)
        budget -= cost
        if budget <= 0:
            raise SnapshotRefused(
                "the snapshot's symlinks take too long to follow (chains of links through "
                "links); replace them with copies"
            )
        if not inside:
            raise SnapshotRefused(
                f"the snapshot's symlink {name!r} points outside the tree ({target!r}) "
                "through its other symlinks"
            )


def _resolves_inside(
    base: str, target: str, links: dict[str, str], budget: int
) -> tuple[bool, int]:
    """Whether `target`, relative to `base`, stays in the tree, and what it cost to know.

    Follows the archive's symlinks like the kernel does; a loop (more than MAX_LINK_HOPS
    links) lands nowhere, which is inside. Stops once `budget` characters were looked up.
    """
    parts: list[str] = []
    todo = deque((base.split("/") if base else []) + target.split("/"))
    cost = hops = 0
    while todo and cost < budget:
        part = todo.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return False, cost
            parts.pop()
            continue
        parts.append(part)
        path = "/".join(parts)
        cost += len(path) + 1
        link = links.get(path)
        if link is None:
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            return True, cost
        if link.startswith("/"):
            return False, cost
        parts.pop()
        todo.extendleft(reversed(link.split("/")))
    return True, cost


def check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if name.startswith("/") or "\\" in name or ".." in name.split("/"):
        raise SnapshotRefused(
            f"the snapshot has an unsafe path {name!r}; paths must stay inside "
            "the working directory"
        )
    if member.isdir() or member.isfile():
        return
    if member.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
        if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise SnapshotRefused(
                f"the snapshot's symlink {name!r} points outside the tree ({member.linkname!r})"
            )
        return
    kind = "hard link" if member.islnk() else "device or special file"
    raise SnapshotRefused(
        f"the snapshot holds a {kind} {name!r}; only files, directories and "
        "symlinks inside the tree are allowed"
    )


def _too_big(size: int, limit: int) -> str:
    return (
        f"the snapshot is {size / 2**20:.1f} MiB and the limit is {limit / 2**20:.0f} MiB; "
        "add large files to .sfignore"
    )


# The client reads it before it packs a snapshot (`sf.project`, a mirror: the client cannot
# import the server; tests/client/test_mirrors.py holds the two equal).
PROJECT_FILE = "starforge.toml"
PROJECT_FILE_MAX_BYTES = 64 * 1024


def read_project_file(sha256: str) -> dict:
    """The parsed starforge.toml at the root of a stored snapshot ({} when there is none).

    The archive is read as a stream (gzip cannot seek anyway), so a blob in object storage is
    read once, front to back, and no further than the file.
    """
    try:
        with open_snapshot(sha256) as blob, tarfile.open(fileobj=blob, mode="r|gz") as archive:
            raw = _project_bytes(archive)
        return {} if raw is None else tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SnapshotRefused(f"{PROJECT_FILE} is not valid TOML ({exc})") from exc
    except (tarfile.TarError, OSError, EOFError, objects.ObjectMissing) as exc:
        raise SnapshotRefused(f"the snapshot cannot be read ({exc})") from exc


def _project_bytes(archive: tarfile.TarFile) -> bytes | None:
    for member in archive:
        if member.isfile() and member.name.removeprefix("./") == PROJECT_FILE:
            if member.size > PROJECT_FILE_MAX_BYTES:
                raise SnapshotRefused(f"{PROJECT_FILE} is over {PROJECT_FILE_MAX_BYTES} bytes")
            handle = archive.extractfile(member)
            return handle.read() if handle else b""
    return None
