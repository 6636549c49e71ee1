"""Hostile snapshot uploads, generated: whatever an archive hides, it is refused or kept whole.

Hypothesis builds archives of ordinary members with one hostile member put anywhere among them
(an escaping name, a hard link, a device, a symlink out of the tree or through another, a
member under a symlink, a bomb), and truncated or mislabelled bodies. Each must be refused with
a 4xx and a sentence, with nothing written anywhere: not in the store, not beside it. The
runner's unpacking is held to the same rule: an archive the server keeps unpacks entirely
inside the run directory, and any archive at all writes nothing outside it.
"""

import gzip
import os
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from jobs.models import Snapshot
from jobs.stores.snapshots import HEADROOM_BYTES, SnapshotRefused, validate_archive
from tests.archives import entry as tar_entry
from tests.archives import tar_gz as pack_entries

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client"))
from sf.ingest import IngestError, safe_unpack  # noqa: E402
from sf.snapshot import SnapshotError, build  # noqa: E402

pytestmark = pytest.mark.django_db


def entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    """A member as plain values: Hypothesis may pack the same example more than once."""
    return name, data, kind, link


def tar_gz(*members: tuple, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    return pack_entries(*(tar_entry(*member) for member in members), fmt=fmt)


examples = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

segment = st.text(alphabet="abcdefgh_.-", min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..")
)
relative = st.lists(segment, min_size=1, max_size=4).map("/".join)


@st.composite
def ordinary_tree(draw) -> list:
    """Directories, files and symlinks to files of the same directory: always safe."""
    names = draw(st.lists(relative, min_size=0, max_size=6, unique=True))
    members, dirs, files = [], set(), set()
    for name in names:
        parts = name.split("/")
        if any("/".join(parts[: i + 1]) in files for i in range(len(parts))):
            continue  # a file cannot also be a directory
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder not in dirs:
                dirs.add(folder)
                members.append(entry(folder, kind=tarfile.DIRTYPE))
        if name in dirs:
            continue
        files.add(name)
        members.append(entry(name, draw(st.binary(max_size=64))))
    for name in sorted(files)[:2]:
        link = name + "-link"
        if link not in dirs and link not in files:
            members.append(entry(link, kind=tarfile.SYMTYPE, link=name.rsplit("/", 1)[-1]))
    return members


def climbing(depth: int) -> st.SearchStrategy[str]:
    """A relative target with more `..` than `depth` levels: it leaves the tree."""
    return st.tuples(st.integers(depth + 1, depth + 4), relative).map(
        lambda t: "/".join([".."] * t[0] + [t[1]])
    )


@st.composite
def unsafe_name(draw) -> str:
    name = draw(relative)
    kind = draw(st.sampled_from(["absolute", "dot-dot", "backslash", "dot-dot-inside"]))
    if kind == "absolute":
        return "/" + name
    if kind == "dot-dot":
        return "../" * draw(st.integers(1, 3)) + name
    if kind == "backslash":
        return name.replace("/", "\\") + "\\..\\..\\x"
    parts = name.split("/")
    at = draw(st.integers(0, len(parts)))
    return "/".join(parts[:at] + [".."] * draw(st.integers(1, 3)) + parts[at:])


@st.composite
def hostile_members(draw) -> tuple[list, str]:
    """One or two members that make an archive unacceptable, and the fragment of its refusal."""
    name = "z-" + draw(relative)  # "z-": never the name of an ordinary member
    depth = name.count("/")
    kind = draw(
        st.sampled_from(
            ["name", "hardlink", "device", "absolute link", "climbing link", "under link", "chain"]
        )
    )
    if kind == "name":
        return [entry(draw(unsafe_name()), b"x")], "unsafe path"
    if kind == "hardlink":
        return [entry(name, kind=tarfile.LNKTYPE, link=draw(relative))], "hard link"
    if kind == "device":
        special = draw(st.sampled_from([tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE]))
        return [entry(name, kind=special)], "device or special file"
    if kind == "absolute link":
        target = "/" + draw(relative)
        return [entry(name, kind=tarfile.SYMTYPE, link=target)], "points outside"
    if kind == "climbing link":
        target = draw(climbing(depth))
        return [entry(name, kind=tarfile.SYMTYPE, link=target)], "points outside"
    if kind == "under link":
        below = f"{name}/{draw(relative)}"
        link = entry(name, kind=tarfile.SYMTYPE, link=".")
        return [link, entry(below, b"x")], "under its symlink"
    # a -> c/.. and c -> ".": each inside as text, together the tree's parent.
    hop = "z-hop-" + draw(segment)
    pair = [
        entry(name, kind=tarfile.SYMTYPE, link="/".join([".."] * depth + [hop, ".."])),
        entry(hop, kind=tarfile.SYMTYPE, link="."),
    ]
    if draw(st.booleans()):
        pair.reverse()
    return pair, "through its other symlinks"


def upload(api, body: bytes, content_type: str = "application/gzip"):
    return api.client.post("/api/v1/snapshots", body, content_type=content_type)


def everything_under(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"") for p in root.rglob("*")
    }


def assert_refused_with_nothing_written(response, status, fragment, sandbox, before) -> None:
    assert response.status_code == status, response.content
    detail = response.json()["detail"]
    assert isinstance(detail, str) and fragment in detail and len(detail.split()) >= 5
    assert everything_under(sandbox) == before
    assert Snapshot.objects.count() == 0


@pytest.fixture
def sandbox(settings, tmp_path) -> Path:
    """The store lives inside a sandbox that holds nothing else but a canary file."""
    (tmp_path / "canary.txt").write_text("untouched")
    settings.SF_SNAPSHOT_DIR = tmp_path / "store"
    settings.SF_SNAPSHOT_DIR.mkdir()
    return tmp_path


@examples
@given(tree=ordinary_tree(), hostile=hostile_members(), data=st.data())
def test_an_archive_with_a_hostile_member_anywhere_is_refused(api, sandbox, tree, hostile, data):
    members, fragment = hostile
    at = data.draw(st.integers(0, len(tree)), label="position")
    before = everything_under(sandbox)
    response = upload(api, tar_gz(*tree[:at], *members, *tree[at:]))
    assert_refused_with_nothing_written(response, 400, fragment, sandbox, before)


@examples
@given(
    excess=st.integers(1, 3 * 1024 * 1024),
    where=st.sampled_from(["file", "long name", "after the end"]),
)
def test_a_bomb_is_refused_with_413(api, sandbox, settings, excess, where):
    limit = settings.SF_MAX_SNAPSHOT_UNPACKED_BYTES = 64 * 1024
    # Headers and padding may add HEADROOM_BYTES to what the files declare, no more.
    size = limit + excess if where == "file" else limit + HEADROOM_BYTES + excess
    if where == "file":
        body = tar_gz(entry("zeros.bin", b"\0" * size))
    elif where == "long name":
        body = tar_gz(entry("n" * size, b"x"), fmt=tarfile.GNU_FORMAT)
    else:
        body = gzip.compress(gzip.decompress(tar_gz(entry("a.py", b"x"))) + b"\0" * size)
    before = everything_under(sandbox)
    response = upload(api, body)
    assert_refused_with_nothing_written(response, 413, "unpacks to more than", sandbox, before)


@examples
@given(tree=ordinary_tree(), cut=st.floats(0.0, 1.0, exclude_max=True))
def test_a_truncated_archive_is_refused(api, sandbox, tree, cut):
    body = tar_gz(*tree, entry("z.bin", os.urandom(2048)))
    before = everything_under(sandbox)
    response = upload(api, body[: max(1, int(len(body) * cut))])
    assert_refused_with_nothing_written(response, 400, "not a readable", sandbox, before)


def test_a_loop_of_long_links_is_refused_before_it_costs_minutes(api, sandbox):
    # Each turn of the loop walks 1,300 directories down and back up again.
    target = "/".join(["d"] * 1300 + [".."] * 1300 + ["x"])
    before = everything_under(sandbox)
    response = upload(api, tar_gz(entry("x", kind=tarfile.SYMTYPE, link=target)))
    assert_refused_with_nothing_written(response, 400, "take too long", sandbox, before)


accepted = {"application/gzip", "application/x-gzip", "application/x-tar+gzip"}
accepted |= {"application/octet-stream"}


@examples
@given(
    content_type=st.one_of(
        st.sampled_from(["application/json", "text/plain", "application/zip", "multipart/x"]),
        st.from_regex(r"\A[a-z]{1,8}/[a-z0-9.+-]{1,12}\Z"),
    )
)
def test_a_body_of_another_content_type_is_415(api, sandbox, content_type):
    assume(content_type not in accepted)
    before = everything_under(sandbox)
    response = upload(api, tar_gz(entry("a.py", b"x")), content_type)
    assert_refused_with_nothing_written(response, 415, "application/gzip", sandbox, before)


@examples
@given(tree=ordinary_tree())
def test_an_ordinary_tree_is_kept_and_unpacks_inside_the_run_directory(api, sandbox, tree):
    response = upload(api, tar_gz(*tree))
    assert response.status_code == 201, response.content
    archive = sandbox / "upload.tar.gz"
    archive.write_bytes(tar_gz(*tree))
    run = sandbox / f"run-{response.json()['sha256'][:12]}"
    safe_unpack(str(archive), str(run))
    for path in run.rglob("*"):
        assert os.path.realpath(path).startswith(str(run.resolve()) + os.sep)


# -- the runner's side: any archive at all ---------------------------------------------------------

member_name = st.lists(st.sampled_from(["a", "b", "..", ".", "c"]), min_size=1, max_size=4).map(
    "/".join
)
link_target = st.one_of(
    member_name, st.just("/tmp"), st.just("."), member_name.map(lambda n: "../" + n)
)
any_member = st.one_of(
    st.builds(lambda n: entry(n, b"data"), member_name),
    st.builds(lambda n: entry(n, kind=tarfile.DIRTYPE), member_name),
    st.builds(lambda n, t: entry(n, kind=tarfile.SYMTYPE, link=t), member_name, link_target),
    st.builds(lambda n, t: entry(n, kind=tarfile.LNKTYPE, link=t), member_name, member_name),
)


def server_keeps(body: bytes, path: Path) -> bool:
    path.write_bytes(body)
    try:
        validate_archive(str(path))
    except SnapshotRefused:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=st.lists(any_member, max_size=8))
@example(  # each link inside as text; together, a symlink to the run directory's parent
    members=[
        entry("a", kind=tarfile.SYMTYPE, link="b/.."),
        entry("b", kind=tarfile.SYMTYPE, link="."),
    ]
)
def test_unpacking_any_archive_writes_nothing_outside_the_run_directory(tmp_path_factory, members):
    sandbox = tmp_path_factory.mktemp("unpack")
    (sandbox / "outside").mkdir()
    (sandbox / "outside" / "canary.txt").write_text("untouched")
    run = sandbox / "jobs" / "run"
    archive = sandbox / "snapshot.tar.gz"
    kept = server_keeps(tar_gz(*members), archive)
    before = everything_under(sandbox / "outside")
    try:
        safe_unpack(str(archive), str(run))
        unpacked = True
    except IngestError:
        unpacked = False
    assert everything_under(sandbox / "outside") == before
    assert {p.name for p in sandbox.iterdir()} == {"outside", "jobs", "snapshot.tar.gz"}
    assert {p.name for p in (sandbox / "jobs").iterdir()} == {"run"}
    if kept and unpacked:
        # No link of what the server keeps leads out of the run.
        root = str(run.resolve())
        for path in run.rglob("*"):
            real = os.path.realpath(path)
            assert real == root or real.startswith(root + os.sep), (path, real)


def test_the_client_refuses_a_link_that_leaves_the_tree_through_another(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    (root / "c").symlink_to(".")
    (root / "a").symlink_to("c/..")
    with pytest.raises(SnapshotError, match="points outside"):
        build(str(root))
