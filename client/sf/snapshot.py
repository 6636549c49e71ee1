"""Owns code snapshots: walking a directory with ignore rules and packing it deterministically.

The same tree must always produce byte-identical `.tar.gz` output (and so the same sha256),
which lets the server deduplicate uploads and lets every attempt of a job see the same code.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import stat
import tarfile
import tempfile
from typing import IO

DEFAULT_MAX_MB = 100.0
IGNORE_FILES = (".gitignore",)
ROOT_IGNORE = ".sfignore"
ALWAYS_SKIP = {".git"}


class SnapshotError(Exception):
    """The directory cannot be snapshotted (too big, unsafe symlink, unreadable)."""


class Rule:
    """One gitignore pattern, compiled relative to the directory of the file it came from."""

    def __init__(self, base: str, pattern: str) -> None:
        self.base = base
        self.negate = pattern.startswith("!")
        if self.negate:
            pattern = pattern[1:]
        elif pattern.startswith("\\"):
            pattern = pattern[1:]  # "\#x" / "\!x" escape a leading special character
        self.dir_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        anchored = "/" in pattern
        pattern = pattern.lstrip("/")
        prefix = "" if anchored else "(?:.*/)?"
        self.regex = re.compile(prefix + _translate(pattern), re.DOTALL)

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        return self.regex.fullmatch(rel) is not None


def _translate(pattern: str) -> str:
    out, i, n = [], 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def parse_rules(text: str, base: str = "") -> list[Rule]:
    """Parse gitignore-style text into rules relative to `base` (a tree-relative dir)."""
    rules = []
    for line in text.splitlines():
        line = line.rstrip()
        if line and not line.startswith("#"):
            rules.append(Rule(base, line))
    return rules


def _read_rules(path: str, base: str) -> list[Rule]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return parse_rules(fh.read(), base)
    except FileNotFoundError:
        return []


class Ignorer:
    """Decides ignores: nested .gitignore files refine their parents; .sfignore has the last
    word."""

    def __init__(self, root: str) -> None:
        self.git_rules: list[Rule] = []
        self.sf_rules = _read_rules(os.path.join(root, ROOT_IGNORE), "")

    def push_dir(self, abs_dir: str, rel_dir: str) -> int:
        """Load the .gitignore of a directory being entered; returns how many rules to pop."""
        added = []
        for name in IGNORE_FILES:
            added += _read_rules(os.path.join(abs_dir, name), rel_dir)
        self.git_rules.extend(added)
        return len(added)

    def pop(self, count: int) -> None:
        if count:
            del self.git_rules[-count:]

    def ignored(self, rel: str, is_dir: bool) -> bool:
        verdict = False
        # Rules are ordered shallow→deep and in file order, so the last match wins like git.
        for rules in (self.git_rules, self.sf_rules):
            for rule in rules:
                if rule.matches(rel, is_dir):
                    verdict = not rule.negate
        return verdict


class Entry:
    """One archive member: a directory, regular file or in-tree symlink."""

    __slots__ = ("kind", "link", "mode", "rel", "size")

    def __init__(self, rel: str, kind: str, size: int = 0, mode: int = 0, link: str = "") -> None:
        self.rel, self.kind, self.size, self.mode, self.link = rel, kind, size, mode, link


def collect(root: str) -> list[Entry]:
    """Walk `root` in sorted order applying ignore rules; returns entries to archive."""
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise SnapshotError(f"{root} is not a directory")
    ignorer = Ignorer(root)
    entries: list[Entry] = []
    _walk(root, "", root, ignorer, entries)
    return entries


def _walk(root: str, rel_dir: str, abs_dir: str, ignorer: Ignorer, out: list[Entry]) -> None:
    pushed = ignorer.push_dir(abs_dir, rel_dir)
    try:
        names = sorted(os.listdir(abs_dir))
    except OSError as exc:
        raise SnapshotError(f"cannot read directory {abs_dir}: {exc.strerror}") from exc
    for name in names:
        if name in ALWAYS_SKIP:
            continue
        rel = f"{rel_dir}/{name}" if rel_dir else name
        path = os.path.join(abs_dir, name)
        st = os.lstat(path)
        is_dir = stat.S_ISDIR(st.st_mode)
        if ignorer.ignored(rel, is_dir):
            continue
        if is_dir:
            out.append(Entry(rel, "dir", mode=0o755))
            _walk(root, rel, path, ignorer, out)
        elif stat.S_ISREG(st.st_mode):
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            out.append(Entry(rel, "file", size=st.st_size, mode=mode))
        elif stat.S_ISLNK(st.st_mode):
            out.append(Entry(rel, "link", mode=0o777, link=_inside_link(root, rel, path)))
        # Sockets, FIFOs and device nodes are never meaningful in a code snapshot: skip them.
    ignorer.pop(pushed)


def _inside_link(root: str, rel: str, path: str) -> str:
    """Return a relative link target if the symlink stays inside the tree, else refuse."""
    target = os.readlink(path)
    parent = os.path.dirname(rel)
    if os.path.isabs(target):
        resolved = os.path.relpath(os.path.normpath(target), root)
    else:
        resolved = os.path.normpath(os.path.join(parent, target))
    real = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
    # The real path too: `a -> c/..` reads as inside, but with `c -> .` it is the tree's parent.
    if any(p == ".." or p.startswith("../") or os.path.isabs(p) for p in (resolved, real)):
        raise SnapshotError(
            f"symlink {rel} -> {target} points outside {root}; "
            "replace it with a copy or add it to .sfignore"
        )
    # Absolute in-tree links would break once unpacked elsewhere, so store them relative.
    return os.path.relpath(resolved, parent or ".") if os.path.isabs(target) else target


def check_size(root: str, entries: list[Entry], max_mb: float) -> int:
    """Raise if the uncompressed file bytes exceed `max_mb` MiB; returns the total."""
    total = sum(e.size for e in entries)
    limit = int(max_mb * 1024 * 1024)
    if total <= limit:
        return total
    largest = sorted((e for e in entries if e.kind == "file"), key=lambda e: (-e.size, e.rel))[:5]
    listing = "\n".join(f"  {_mib(e.size):>10}  {e.rel}" for e in largest)
    raise SnapshotError(
        f"snapshot of {root} is {_mib(total)}, over the {max_mb:g} MiB limit.\n"
        f"largest files:\n{listing}\n"
        "add them to .sfignore (gitignore syntax) or raise --max-snapshot-mb"
    )


def _mib(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _tarinfo(entry: Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.rel)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    info.mode = entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif entry.kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, entry.link
    else:
        info.size = entry.size
    return info


class _HashingWriter:
    """File wrapper that hashes and counts everything written through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.sha, self.size = raw, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def write_archive(root: str, entries: list[Entry], out: IO[bytes]) -> tuple[str, int]:
    """Write entries as a deterministic .tar.gz to `out`; returns (sha256 hex, byte size)."""
    sink = _HashingWriter(out)
    # filename="" and mtime=0 keep the gzip header free of anything that varies between runs.
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for entry in entries:
            _add(tar, root, entry)
    return sink.sha.hexdigest(), sink.size


def _add(tar: tarfile.TarFile, root: str, entry: Entry) -> None:
    info = _tarinfo(entry)
    if entry.kind != "file":
        tar.addfile(info)
        return
    with open(os.path.join(root, entry.rel), "rb") as fh:
        if os.fstat(fh.fileno()).st_size != entry.size:
            raise SnapshotError(f"{entry.rel} changed while the snapshot was being packed")
        tar.addfile(info, fh)


class Snapshot:
    """A packed snapshot on disk; delete it with close()."""

    def __init__(self, path: str, sha256: str, size: int, files: int, raw_bytes: int) -> None:
        self.path, self.sha256, self.size = path, sha256, size
        self.files, self.raw_bytes = files, raw_bytes

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def build(root: str, max_mb: float = DEFAULT_MAX_MB) -> Snapshot:
    """Pack `root` into a temporary .tar.gz file, enforcing the size cap first."""
    root = os.path.abspath(root)
    entries = collect(root)
    raw = check_size(root, entries, max_mb)
    fd, path = tempfile.mkstemp(prefix="sf-snapshot-", suffix=".tar.gz")
    try:
        with os.fdopen(fd, "wb") as fh:
            sha, size = write_archive(root, entries, fh)
    except BaseException:
        os.unlink(path)
        raise
    files = sum(1 for e in entries if e.kind == "file")
    return Snapshot(path, sha, size, files, raw)
