"""Owns capturing a job's TensorBoard scalars: event files (`*tfevents*`) under the job's
output directory, its run directory (where `SummaryWriter()` writes `runs/` by default) and
the directory its environment names in `TENSORBOARD_LOGDIR` or `SF_TENSORBOARD_DIR`, read by
the runner every `POLL_S` while the job runs and once more after it ended; each scalar tag a
series (validation where `val`, `eval` or `validation` is a component of the tag's path or
opens it, `val_loss`, `eval/acc`; train otherwise), its step the event's step and its time the
event's wall time, numbered into the runner's metrics with the SDK's points
(`sf.shipping.MetricsTail.add`).

No point twice: an output directory outlives its attempts (a resume or a retry writes beside
the earlier attempts' event files), so only events written since this attempt's ranks started
are taken (`since`); a file untouched since then is never read. Within an attempt each record
is read once (an offset per file); a runner started again in the same attempt numbers from 0
again and the server keeps each number once.

Paths are the job's view of the file system. Without a sandbox (the runner not sandboxing;
Slurm, Ray and Kubernetes, where the job shares the runner's view) that is the runner's own
(`HostView`). A sandboxed job (`sf.sandbox`) has a private /tmp, /var/tmp and /run the host
never sees: there every path is resolved beneath the root of the sandbox's anchor process,
/proc/<anchor>/root (`JobView`), so `TENSORBOARD_LOGDIR=/tmp/tb` is read where the job wrote
it. The anchor lives until the runner closes the sandbox, which it does only after the last
read; once it is gone nothing more is read (a private /tmp dies with the sandbox).

Everything here is the job's: files are opened without following a link, must be regular
files (a FIFO would block) and, for a root runner (run_as), the job's own; the walk follows no
link below the roots (in a sandbox none at all, the roots' own components included: a link
there would be resolved in the runner's view, not the job's) and looks at `MAX_ENTRIES`
entries a pass, `MAX_FILES` files at most; a read takes at most `READ_BUDGET` bytes of a file
a pass. A file's problem (a bad checksum, a record over `sf.tfevents.MAX_RECORD`, lost framing,
a final half record) is told once, in the job's log, and costs that record or the rest of that
file, nothing else.
"""

from __future__ import annotations

import math
import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sf.contract import TENSORBOARD_DIR_VAR, TENSORBOARD_LOGDIR_VAR
from sf.metrics import MAX_NAME
from sf.tfevents import Scalar, maintained_decoder, next_record, scalars_in

POLL_S = 2.0
MAX_ENTRIES = 20_000
MAX_FILES = 256
READ_BUDGET = 16 << 20
FINAL_BUDGET = 512 << 20  # what the last read takes of all files at most
EVENTS_MARK = "tfevents"
MAX_STEP = (1 << 63) - 1
_VALIDATION = re.compile(r"(^|/)(val|eval|validation)(/|$)|^(val|eval|validation)[_.-]", re.I)
PROBLEMS = {
    "oversized": "skipped a record over 1 MiB",
    "bad_crc": "skipped a record whose checksum is wrong",
    "corrupt": "stopped reading: a record's length is corrupt",
    "incomplete": "ended with an incomplete record",
}


def kind_of(tag: str) -> str:
    """The series kind of a scalar tag: validation or train."""
    return "validation" if _VALIDATION.search(tag) else "train"


def roots(output_dir: str, run_dir: str, job_env: dict[str, str]) -> list[str]:
    """The folders whose event files are the job's: relative names are in its run dir. The
    executor's folders by their real paths, where a sandbox binds them (`sf.sandbox`)."""
    output_dir, run_dir = os.path.realpath(output_dir), os.path.realpath(run_dir)
    named = [job_env.get(TENSORBOARD_LOGDIR_VAR, ""), job_env.get(TENSORBOARD_DIR_VAR, "")]
    found = [output_dir, run_dir, *(os.path.join(run_dir, n) for n in named if n)]
    unique: list[str] = []
    for path in (os.path.abspath(p) for p in found if p):
        if path not in unique:
            unique.append(path)
    return unique


class HostView:
    """The runner's own file system, which is the job's where it is not sandboxed: a root
    folder may be a link (as the job or the executor named it), nothing below it is followed."""

    def open(self, path: str, flags: int) -> int:
        return os.open(path, flags)

    def lstat(self, path: str) -> os.stat_result:
        return os.lstat(path)

    def close(self) -> None:
        pass


class JobView:
    """A sandboxed job's file system as its anchor process sees it, private /tmp included.

    /proc/<pid>/root is a magic link, and a link beneath it is resolved against the runner's
    root: /tmp/tb -> /etc would lead out of the job's view. So each path is walked one
    component at a time from that root, with O_NOFOLLOW and no "." or "..". The pid's /proc
    folder is opened once: should the anchor end, every later open fails (ENOENT) rather than
    reach whichever process took its pid next."""

    def __init__(self, pid: int) -> None:
        try:
            self.proc: int | None = os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY)
        except OSError:
            self.proc = None  # already gone: nothing is read

    def open(self, path: str, flags: int) -> int:
        parent, name = self._parent(path)
        try:
            return os.open(name, flags | os.O_NOFOLLOW, dir_fd=parent)
        finally:
            os.close(parent)

    def lstat(self, path: str) -> os.stat_result:
        parent, name = self._parent(path)
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)

    def close(self) -> None:
        if self.proc is not None:
            os.close(self.proc)
            self.proc = None

    def _parent(self, path: str) -> tuple[int, str]:
        """An O_PATH descriptor of the folder that holds `path` in the job's view, and the
        name in it ("." for the root itself)."""
        if self.proc is None:
            raise FileNotFoundError(path)
        parts = path.split("/")
        if not path.startswith("/") or any(p in (".", "..") for p in parts):
            raise FileNotFoundError(path)  # the roots are absolute, the walk adds names
        *folders, name = [p for p in parts if p] or ["."]
        fd = os.open("root", os.O_PATH | os.O_DIRECTORY, dir_fd=self.proc)
        try:
            for folder in folders:
                step = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                fd, previous = os.open(folder, step, dir_fd=fd), fd
                os.close(previous)
        except OSError:
            os.close(fd)
            raise
        return fd, name


@dataclass
class EventFile:
    path: str
    identity: tuple[int, int]  # (device, inode) when first seen
    offset: int = 0
    done: bool = False  # framing lost: nothing more is read
    told: set[str] = field(default_factory=set)


class TensorBoardTail:
    """Follows the job's event files, handing each new scalar point to `add`; `anchor`: the
    pid of the job's sandbox anchor, whose view of the files is the job's (`JobView`)."""

    def __init__(
        self,
        folders: list[str],
        add: Callable[[dict], None],
        since: float,
        owner: int | None = None,
        tell: Callable[[str], None] | None = None,
        anchor: int | None = None,
    ) -> None:
        self.folders, self.add, self.since, self.owner = folders, add, since, owner
        self.tell = tell or (lambda _text: None)
        self.view = JobView(anchor) if anchor is not None else HostView()
        self.decode = maintained_decoder() or scalars_in
        self.files: dict[str, EventFile] = {}
        self.skipped = 0  # scalars that are no point (a long tag, a negative step, NaN)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="sf-tensorboard", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Read what the job wrote last, then stop; a half record left at an end is told.
        In a sandbox, before the runner closes it."""
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()
        self.poll(FINAL_BUDGET, final=True)
        self.view.close()
        if self.skipped:
            self.tell(f"skipped {self.skipped} TensorBoard scalars that are no metric point")

    def _loop(self) -> None:
        while not self.done.wait(POLL_S):
            self.poll(READ_BUDGET)

    def poll(self, budget: int, final: bool = False) -> None:
        """Find new event files, then read what each holds since the last read."""
        self.scan()
        left = budget
        for event_file in list(self.files.values()):
            if left <= 0:
                return
            left -= self.read(event_file, min(left, budget if final else READ_BUDGET), final)

    def scan(self) -> None:
        seen = 0
        stack = list(self.folders)
        while stack and seen < MAX_ENTRIES and len(self.files) < MAX_FILES:
            folder = stack.pop()
            below = 0 if folder in self.folders else os.O_NOFOLLOW
            try:
                fd = self.view.open(folder, os.O_RDONLY | os.O_DIRECTORY | below)
            except OSError:
                continue
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        seen += 1
                        path = os.path.join(folder, entry.name)
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(path)
                        elif EVENTS_MARK in entry.name and path not in self.files:
                            self._found(path)
            except OSError:
                continue
            finally:
                os.close(fd)

    def _found(self, path: str) -> None:
        info = self._stat(path)
        if info is None or info.st_mtime < self.since or len(self.files) >= MAX_FILES:
            return  # not the job's file, or an earlier attempt's
        self.files[path] = EventFile(path, (info.st_dev, info.st_ino))

    def _stat(self, path: str) -> os.stat_result | None:
        try:
            info = self.view.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        if self.owner is not None and info.st_uid != self.owner:
            return None
        return info

    def read(self, event_file: EventFile, budget: int, final: bool = False) -> int:
        """Read the new records of one file (at most `budget` bytes); returns the bytes read."""
        if event_file.done:
            return 0
        try:
            fd = self.view.open(event_file.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return 0
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != event_file.identity:
                return 0  # replaced by something else since: not the file we followed
            if self.owner is not None and info.st_uid != self.owner:
                return 0
            return self._records(event_file, fh, info.st_size, budget, final)

    def _records(self, event_file: EventFile, fh, size: int, budget: int, final: bool) -> int:
        start = event_file.offset
        while min(event_file.offset, size) - start < budget:
            found = next_record(fh, event_file.offset, size)
            if found.what == "record":
                for scalar in self.decode(found.data):
                    self._add(scalar)
            elif found.what != "incomplete" or (final and event_file.offset < size):
                self._told(event_file, found.what)
            if found.what in ("incomplete", "corrupt"):
                event_file.done = found.what == "corrupt"
                break
            event_file.offset = found.next_offset
        return max(0, min(event_file.offset, size) - start)

    def _told(self, event_file: EventFile, what: str) -> None:
        if what not in event_file.told:
            event_file.told.add(what)
            self.tell(f"{event_file.path}: {PROBLEMS[what]}")

    def _add(self, scalar: Scalar) -> None:
        if scalar.wall_time < self.since:
            return  # an earlier attempt's, in a file this one appended to
        if not (
            0 < len(scalar.tag) <= MAX_NAME
            and 0 <= scalar.step <= MAX_STEP
            and math.isfinite(scalar.value)
            and math.isfinite(scalar.wall_time)
        ):
            self.skipped += 1
            return
        self.add(
            {
                "kind": kind_of(scalar.tag),
                "name": scalar.tag,
                "step": scalar.step,
                "value": scalar.value,
                "ts": scalar.wall_time,
            }
        )
