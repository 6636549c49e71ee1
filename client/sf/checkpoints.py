"""Owns what the runner tells the server about the job's checkpoints and stop notices: when
the newest file under SF_CHECKPOINT_DIR was written (the scheduler preempts the borrowers
that saved most recently first), and the notice file a stop or preemption leaves for the job.

The checkpoint directory is the job's: it may hold any number of files, links and folders,
made to slow the runner down or to point it elsewhere. The scan is bounded (entries, depth),
follows no link, and only reads metadata. What it finds is a claim of the job's, which the
server bounds by its own clock. Standard library only, like the rest of the runner.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time

from sf.http import ApiError, Client, ConnectError

CHECKPOINT_POLL_S = 10.0
MAX_ENTRIES = 2000
MAX_DEPTH = 3


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def newest_mtime(root: str, max_entries: int = MAX_ENTRIES, max_depth: int = MAX_DEPTH) -> float:
    """The newest modification time of a file below `root` (0.0: none, or no such folder),
    looking at no more than `max_entries` entries and `max_depth` folders down; links are
    neither followed nor counted. Each folder is opened by descriptor, relative to its parent
    and without following a link, so a folder the job swaps for a link leads nowhere."""
    try:
        top = os.open(root, DIR_FLAGS)
    except OSError:
        return 0.0
    newest, seen = 0.0, 0
    todo = [(top, 0)]
    while todo:
        fd, depth = todo.pop()
        try:
            if seen < max_entries:
                newest, seen = _scan(fd, depth, max_depth, max_entries, newest, seen, todo)
        finally:
            os.close(fd)
    return newest


def _scan(
    fd: int, depth: int, max_depth: int, max_entries: int, newest: float, seen: int, todo: list
) -> tuple[float, int]:
    """One folder: its files' newest mtime, its subfolders opened onto `todo`."""
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                seen += 1
                if seen > max_entries:
                    break
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 < max_depth:
                        try:
                            todo.append((os.open(entry.name, DIR_FLAGS, dir_fd=fd), depth + 1))
                        except OSError:
                            pass  # gone, or a link now
                elif entry.is_file(follow_symlinks=False):
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    except OSError:
        pass
    return newest, seen


class CheckpointWatcher:
    """Reports the newest checkpoint's time each time it changes: every CHECKPOINT_POLL_S,
    and once more as the attempt ends (`stop`). Best effort: a report lost is only an older
    time in the scheduler's choice of whom to preempt."""

    def __init__(self, client: Client | None, attempt: int, root: str) -> None:
        self.client, self.attempt, self.root = client, attempt, root
        self.reported = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="sf-checkpoints", daemon=True)

    def start(self) -> None:
        if self.client is not None and self.root:
            self.thread.start()

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.done.set()
        self.thread.join(5.0)
        self.report()

    def _loop(self) -> None:
        while not self.done.wait(CHECKPOINT_POLL_S):
            self.report()

    def report(self) -> None:
        newest = newest_mtime(self.root)
        if newest <= self.reported or self.client is None:
            return
        body = {"attempt": self.attempt, "saved_at": newest}
        try:
            self.client.request("POST", "/api/v1/ingest/checkpoint", json_body=body)
            self.reported = newest
        except (ApiError, ConnectError):
            pass  # the next round sends it again


def write_notice(path: str, kind: str, kill_at: float) -> None:
    """The job's notice file: what is coming ("preempted" or "stopped"), when it was sent and
    when SIGKILL follows (epoch seconds). Written beside a fresh name and renamed over the
    old, never through a link the job may have left at either name."""
    body = json.dumps({"kind": kind, "at": time.time(), "kill_at": kill_at}).encode()
    tmp = f"{path}.{secrets.token_hex(6)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.fchmod(fd, 0o644)  # past the runner's umask: the job reads it
            os.write(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
