"""TensorBoard scalars for the runner (`sf.tfevents`, `sf.tensorboard`): our reader of the event
format against files a real `SummaryWriter` wrote and against TensorBoard's own reader, the
tail's kinds and dedup, and hostile files (truncated, a bad checksum, a huge or corrupt length,
deep nesting, a link, a FIFO, another uid's file), each costing its record or its file only; a
sandboxed job's private /tmp read in its own view, no link there leading into the host's."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sf import tensorboard, tfevents
from sf.sandbox import Sandbox, SandboxConfig
from sf.tensorboard import TensorBoardTail, kind_of

CLIENT = Path(__file__).resolve().parents[2] / "client"

# Run with the job's own Python (PyTorch, TensorBoard): a real SummaryWriter writes scalars
# (old and new style), a histogram and a text; TensorBoard's EventFileLoader and our module with
# TensorBoard's decoder read them back.
WRITE_AND_READ = """
import glob, json, sys
from torch.utils.tensorboard import SummaryWriter
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from sf import tfevents
writer = SummaryWriter(sys.argv[1])
for step in range(5):
    writer.add_scalar("loss", 1.0 / (step + 1), step)
    writer.add_scalar("val/acc", 0.5 + step / 10, step)
    writer.add_scalar("eval_loss", 2.0 - step / 10, step, new_style=True)
import torch
writer.add_histogram("weights", torch.tensor([0.1, 0.2, 0.3]), 0)
writer.add_text("note", "hello", 0)
writer.close()
(path,) = glob.glob(sys.argv[1] + "/*tfevents*")
reference = []
for event in EventFileLoader(path).Load():
    for value in event.summary.value:
        if value.HasField("simple_value"):
            reference.append([value.tag, event.step, event.wall_time, value.simple_value])
        elif value.metadata.plugin_data.plugin_name == "scalars":
            reference.append([value.tag, event.step, event.wall_time, value.tensor.float_val[0]])
decode = tfevents.maintained_decoder()
ours = []
with open(path, "rb") as fh:
    size, offset = len(fh.read()), 0
    while (found := tfevents.next_record(fh, offset, size)).what == "record":
        ours += [[s.tag, s.step, s.wall_time, s.value] for s in decode(found.data)]
        offset = found.next_offset
print(json.dumps({"path": path, "reference": reference, "maintained": ours}))
"""


@pytest.fixture(scope="module")
def written(job_python, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("tb")
    done = subprocess.run(
        [str(job_python), "-c", WRITE_AND_READ, str(folder)],
        env={**os.environ, "PYTHONPATH": str(CLIENT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def ours(path: str) -> list[list]:
    data = Path(path).read_bytes()
    found, offset = [], 0
    with open(path, "rb") as fh:
        while (read := tfevents.next_record(fh, offset, len(data))).what == "record":
            found += [[s.tag, s.step, s.wall_time, s.value] for s in tfevents.scalars_in(read.data)]
            offset = read.next_offset
    return found


def test_crc32c_is_castagnolis():
    assert tfevents.crc32c(b"123456789") == 0xE3069283
    assert tfevents.crc32c(b"") == 0


def test_our_reader_reads_what_summary_writer_wrote_as_tensorboards_own_readers_do(written):
    reference = written["reference"]
    assert [r[0] for r in reference].count("loss") == 5
    assert {r[0] for r in reference} == {"loss", "val/acc", "eval_loss"}
    assert ours(written["path"]) == reference
    assert written["maintained"] == reference


@pytest.mark.parametrize(
    ("tag", "kind"),
    [
        ("loss", "train"),
        ("train/loss", "train"),
        ("val/loss", "validation"),
        ("Loss/validation", "validation"),
        ("eval/acc", "validation"),
        ("val_loss", "validation"),
        ("eval-f1", "validation"),
        ("EVAL_acc", "validation"),
        ("value", "train"),
        ("interval/x", "train"),
        ("evaluation", "train"),
    ],
)
def test_a_tags_kind_is_validation_where_val_eval_or_validation_names_it(tag, kind):
    assert kind_of(tag) == kind


def tail_of(folder: Path, since: float = 0.0, owner: int | None = None):
    points, told = [], []
    tail = TensorBoardTail([str(folder)], points.append, since, owner, tell=told.append)
    return tail, points, told


def copy_to(written: dict, folder: Path, data: bytes | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / Path(written["path"]).name
    target.write_bytes(data if data is not None else Path(written["path"]).read_bytes())
    return target


def records(path: str) -> list[tuple[int, int]]:
    """(offset, length) of each record of a good file."""
    data, found, offset = Path(path).read_bytes(), [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        found.append((offset, length))
        offset += 16 + length
    return found


def test_the_tail_ships_each_scalar_once_with_its_kind_step_and_wall_time(written, tmp_path):
    copy_to(written, tmp_path / "out" / "runs" / "exp1")
    tail, points, told = tail_of(tmp_path / "out")
    tail.poll(tensorboard.READ_BUDGET)
    tail.poll(tensorboard.READ_BUDGET)
    tail.stop()
    expected = [
        {"kind": kind_of(t), "name": t, "step": s, "value": v, "ts": w}
        for t, s, w, v in written["reference"]
    ]
    assert points == expected and told == []
    assert {p["kind"] for p in points if p["name"] != "loss"} == {"validation"}


def test_an_earlier_attempts_events_are_not_shipped_again(written, tmp_path):
    path = copy_to(written, tmp_path / "out")
    since = time.time() + 1  # this attempt's ranks start after the file was last written
    tail, points, _ = tail_of(tmp_path / "out", since=since)
    tail.stop()
    assert points == [] and tail.files == {}  # untouched since: never read
    os.utime(path, (since + 5, since + 5))  # appended to since: read, its old events left out
    tail, points, _ = tail_of(tmp_path / "out", since=since)
    tail.stop()
    assert points == [] and str(path) in tail.files


def test_a_half_written_record_waits_for_its_end_and_is_told_once_at_the_last_read(
    written, tmp_path
):
    data = Path(written["path"]).read_bytes()
    offset, length = records(written["path"])[3]
    path = copy_to(written, tmp_path / "out", data[: offset + 10])
    tail, points, told = tail_of(tmp_path / "out")
    tail.poll(tensorboard.READ_BUDGET)
    assert told == [] and len(points) == len(ours(str(path)))
    before = len(points)
    with open(path, "ab") as fh:
        fh.write(data[offset + 10 : offset + 16 + length])
    tail.poll(tensorboard.READ_BUDGET)
    assert len(points) >= before and told == []
    with open(path, "ab") as fh:
        fh.write(data[offset + 16 + length : offset + 16 + length + 5])
    tail.stop()
    assert told == [f"{path}: ended with an incomplete record"]


def corrupted(written: dict, index: int, change) -> tuple[bytes, int]:
    data = bytearray(Path(written["path"]).read_bytes())
    offset, length = records(written["path"])[index]
    change(data, offset, length)
    return bytes(data), offset


@pytest.mark.parametrize(
    ("change", "problem", "rest_read"),
    [
        (lambda d, o, n: d.__setitem__(o + 12, d[o + 12] ^ 0xFF), "checksum is wrong", True),
        (lambda d, o, n: d.__setitem__(o + 3, 0x7F), "length is corrupt", False),
    ],
)
def test_a_bad_checksum_costs_its_record_and_a_corrupt_length_the_rest_of_its_file(
    written, tmp_path, change, problem, rest_read
):
    data, _ = corrupted(written, 4, change)
    bad = copy_to(written, tmp_path / "out" / "bad", data)
    copy_to(written, tmp_path / "out" / "good")
    tail, points, told = tail_of(tmp_path / "out")
    tail.stop()
    assert len(told) == 1 and told[0].startswith(str(bad)) and problem in told[0]
    total = len(written["reference"])
    from_bad = len(points) - total  # the good file's are all there
    assert from_bad == (total - 1 if rest_read else len(ours_before(written, 4)))


def ours_before(written: dict, index: int) -> list:
    offset, _ = records(written["path"])[index]
    data = Path(written["path"]).read_bytes()[:offset]
    folder = Path(written["path"]).parent / "before"
    folder.mkdir(exist_ok=True)
    (folder / "x.tfevents").write_bytes(data)
    return ours(str(folder / "x.tfevents"))


def frame(data: bytes, length: int | None = None) -> bytes:
    header = struct.pack("<Q", len(data) if length is None else length)
    return (
        header
        + struct.pack("<I", tfevents.masked_crc(header))
        + data
        + struct.pack("<I", tfevents.masked_crc(data))
    )


def test_a_huge_length_is_never_read_and_a_record_over_a_mib_is_stepped_over(written, tmp_path):
    good = Path(written["path"]).read_bytes()
    big = frame(b"\x00" * (tfevents.MAX_RECORD + 1))
    path = copy_to(written, tmp_path / "out" / "big", big + good)
    tail, points, told = tail_of(tmp_path / "out")
    tail.stop()
    assert told == [f"{path}: skipped a record over 1 MiB"]
    assert len(points) == len(written["reference"])
    huge = struct.pack("<Q", 1 << 60)
    crafted = good + huge + struct.pack("<I", tfevents.masked_crc(huge)) + b"x" * 100
    path = copy_to(written, tmp_path / "out2", crafted)
    tail, points, told = tail_of(tmp_path / "out2")
    tail.stop()
    assert told == [f"{path}: skipped a record over 1 MiB"]
    assert len(points) == len(written["reference"])


def nested(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):
        inner = b"\x0a" + _varint(len(inner)) + inner  # field 1, length-delimited
    return b"\x2a" + _varint(len(inner)) + inner  # Event.summary


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def test_deep_nesting_and_garbage_records_yield_no_scalar_and_cost_nothing_else(written, tmp_path):
    assert tfevents.scalars_in(nested(5000)) == []
    assert tfevents.scalars_in(b"\xff" * 64) == []
    assert tfevents.scalars_in(b"\x0b\x0c") == []  # a group
    data = frame(nested(5000)) + frame(b"\xff" * 64) + Path(written["path"]).read_bytes()
    copy_to(written, tmp_path / "out", data)
    tail, points, told = tail_of(tmp_path / "out")
    tail.stop()
    assert len(points) == len(written["reference"]) and told == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another uid needs root")
def test_links_fifos_and_files_not_the_jobs_are_never_read(written, tmp_path):
    secret = tmp_path / "secret.tfevents"
    secret.write_bytes(Path(written["path"]).read_bytes())  # root's, as the runner is
    secret.chmod(0o600)
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 4242, 4242)
    (out / "events.out.tfevents.link").symlink_to(secret)
    os.link(secret, out / "events.out.tfevents.hardlink")
    os.mkfifo(out / "events.out.tfevents.fifo")
    (out / "dir.tfevents.link").symlink_to(tmp_path, target_is_directory=True)
    mine = copy_to(written, out / "mine")
    os.chown(mine, 4242, 4242)
    tail, points, told = tail_of(out, owner=4242)
    began = time.monotonic()
    tail.stop()
    assert time.monotonic() - began < 5  # the FIFO blocked nothing
    assert list(tail.files) == [str(mine)]
    assert len(points) == len(written["reference"]) and told == []


JOB_UID = 200_001
# The job, in its sandbox as its uid: an event file of its own in its private /tmp, and links
# from there to a host folder and a host event file (the host's /tmp, which it cannot see).
PLANTS_LINKS = """
import os, sys
secret, host = sys.argv[1], sys.argv[2]
os.makedirs("/tmp/tb/mine")
with open("/tmp/tb/mine/events.out.tfevents.mine", "wb") as fh:
    fh.write(sys.stdin.buffer.read())
os.symlink(secret, "/tmp/tb/events.out.tfevents.link")
os.symlink(host, "/tmp/tb/host")
os.symlink(host, "/tmp/linked")
os.symlink(os.path.dirname(host), "/tmp/up")
print(os.path.exists(secret))
"""


@pytest.fixture
def sandboxed(written):
    """A real sandbox whose job planted `PLANTS_LINKS`; the host folder the links name holds
    an event file of the job's uid, so only the rule on links keeps it out."""
    work = Path(tempfile.mkdtemp(prefix="sf-tb-"))
    work.chmod(0o711)
    for name in ("work", "host"):
        (work / name).mkdir()
        os.chown(work / name, JOB_UID, JOB_UID)
    secret = copy_to(written, work / "host")
    os.chown(secret, JOB_UID, JOB_UID)
    sandbox = Sandbox.open(SandboxConfig(199_999), [str(work / "work")], str(work))
    try:
        argv = [sys.executable, "-I", "-c", PLANTS_LINKS, str(secret), str(work / "host")]
        done = subprocess.run(
            sandbox.enter(argv, str(work / "work"), JOB_UID, JOB_UID),
            input=Path(written["path"]).read_bytes(),
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == b"False\n"  # the host's /tmp is not the job's
        yield sandbox, work
    finally:
        sandbox.close()
        shutil.rmtree(work)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")
def test_a_sandboxed_jobs_tmp_is_read_in_its_own_view_and_no_link_leads_out_of_it(
    written, sandboxed
):
    sandbox, work = sandboxed
    folders = ["/tmp/tb", "/tmp/linked", f"/tmp/up/{(work / 'host').name}"]
    points, told = [], []
    tail = TensorBoardTail(folders, points.append, 0.0, JOB_UID, told.append, sandbox.anchor)
    tail.stop()
    assert list(tail.files) == ["/tmp/tb/mine/events.out.tfevents.mine"]
    assert len(points) == len(written["reference"]) and told == []
    # Once the sandbox is gone, so is its /tmp: nothing is read, nothing fails.
    late: list[dict] = []
    after = TensorBoardTail(["/tmp/tb"], late.append, 0.0, JOB_UID, anchor=sandbox.anchor)
    sandbox.close()
    after.stop()
    assert late == [] and after.files == {}
