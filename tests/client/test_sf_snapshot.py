"""Snapshot packing: ignore rules, determinism, symlinks and the size cap."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from sf import snapshot
from sf.snapshot import SnapshotError


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def names(root: Path) -> list[str]:
    return [e.rel for e in snapshot.collect(str(root)) if e.kind != "dir"]


def members(root: Path) -> dict[str, tarfile.TarInfo]:
    buf = io.BytesIO()
    snapshot.write_archive(str(root), snapshot.collect(str(root)), buf)
    buf.seek(0)
    with tarfile.open(fileobj=buf, mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_gitignore_negation_keeps_file(tmp_path: Path) -> None:
    make_tree(tmp_path, {".gitignore": "*.log\n!keep.log\n", "a.log": "", "keep.log": ""})
    assert names(tmp_path) == [".gitignore", "keep.log"]


def test_nested_gitignore_applies_below_its_directory_only(tmp_path: Path) -> None:
    make_tree(tmp_path, {"sub/.gitignore": "*.tmp\n", "sub/x.tmp": "", "y.tmp": ""})
    assert names(tmp_path) == ["sub/.gitignore", "y.tmp"]


def test_anchored_pattern_matches_only_at_its_level(tmp_path: Path) -> None:
    make_tree(tmp_path, {".gitignore": "/build\n", "build/a": "", "src/build/b": ""})
    assert names(tmp_path) == [".gitignore", "src/build/b"]


def test_trailing_slash_matches_directories_only(tmp_path: Path) -> None:
    make_tree(tmp_path, {".gitignore": "data/\n", "data/x": "", "src/data": "file"})
    assert names(tmp_path) == [".gitignore", "src/data"]


def test_double_star_and_question_mark_patterns(tmp_path: Path) -> None:
    files = {
        ".gitignore": "a/**/z.txt\nf?.bin\n",
        "a/z.txt": "",
        "a/b/c/z.txt": "",
        "f1.bin": "",
        "f12.bin": "",
    }
    make_tree(tmp_path, files)
    assert names(tmp_path) == [".gitignore", "f12.bin"]


def test_sfignore_has_the_last_word(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            ".gitignore": "*.csv\n",
            ".sfignore": "# comment\n\n!small.csv\nckpt/\n",
            "small.csv": "",
            "big.csv": "",
            "ckpt/1": "",
        },
    )
    assert names(tmp_path) == [".gitignore", ".sfignore", "small.csv"]


def test_git_directory_is_always_skipped(tmp_path: Path) -> None:
    make_tree(tmp_path, {".git/HEAD": "ref", "main.py": ""})
    assert names(tmp_path) == ["main.py"]


def test_same_tree_gives_same_sha(tmp_path: Path) -> None:
    files = {"main.py": "print(1)\n", "pkg/mod.py": "x = 1\n", "z/y/x.txt": "deep"}
    first, second = make_tree(tmp_path / "a", files), make_tree(tmp_path / "b", files)
    os.utime(second / "main.py", (1, 1))
    (second / "pkg" / "mod.py").chmod(0o600)  # only the exec bit is kept, so this must not matter
    sha_a, _ = snapshot.write_archive(str(first), snapshot.collect(str(first)), io.BytesIO())
    sha_b, _ = snapshot.write_archive(str(second), snapshot.collect(str(second)), io.BytesIO())
    assert sha_a == sha_b


def test_archive_members_are_normalised_and_keep_exec_bit(tmp_path: Path) -> None:
    make_tree(tmp_path, {"run.sh": "#!/bin/sh\n", "data.txt": "x"})
    (tmp_path / "run.sh").chmod(0o750)
    got = members(tmp_path)
    assert list(got) == ["data.txt", "run.sh"]
    assert (got["run.sh"].mode, got["data.txt"].mode) == (0o755, 0o644)
    assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in got.values())


def test_symlink_inside_tree_is_stored_as_symlink(tmp_path: Path) -> None:
    make_tree(tmp_path, {"real.txt": "x"})
    (tmp_path / "link.txt").symlink_to("real.txt")
    (tmp_path / "abs.txt").symlink_to(tmp_path / "real.txt")
    got = members(tmp_path)
    assert got["link.txt"].issym() and got["link.txt"].linkname == "real.txt"
    assert got["abs.txt"].linkname == "real.txt"  # absolute in-tree links are made relative


def test_symlink_outside_tree_is_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "root", {"a.py": ""})
    (root / "escape").symlink_to("../outside")
    with pytest.raises(SnapshotError, match="points outside"):
        snapshot.collect(str(root))


def test_snapshot_over_cap_names_largest_files(tmp_path: Path) -> None:
    sizes = {f"f{i}.bin": i * 100_000 for i in range(1, 8)}
    for rel, size in sizes.items():
        (tmp_path / rel).write_bytes(b"\0" * size)
    with pytest.raises(SnapshotError) as err:
        snapshot.build(str(tmp_path), max_mb=1)
    message = str(err.value)
    assert "over the 1 MiB limit" in message and "2.7 MiB" in message and ".sfignore" in message
    assert all(f"f{i}.bin" in message for i in range(3, 8))
    assert "f1.bin" not in message and "f2.bin" not in message


def test_build_writes_file_matching_its_sha(tmp_path: Path) -> None:
    import hashlib

    make_tree(tmp_path / "src", {"a.py": "print('hi')\n"})
    snap = snapshot.build(str(tmp_path / "src"))
    try:
        assert hashlib.sha256(Path(snap.path).read_bytes()).hexdigest() == snap.sha256
        assert snap.files == 1 and snap.raw_bytes == len("print('hi')\n")
    finally:
        snap.close()
    assert not os.path.exists(snap.path)
