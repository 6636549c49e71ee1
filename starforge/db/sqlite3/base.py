"""The embedded ledger's SQLite backend: Django's, with writers that wait for each other promptly.

SQLite lets one connection write at a time. A transaction here starts with BEGIN IMMEDIATE
(settings: `transaction_mode`), which takes the write lock or waits for it in SQLite's busy
handler, and that handler sleeps in growing steps, 1, 2, 5, 10, ... up to 100 ms, however soon
the lock comes free. Under load that sleep was most of a submit's time: with a scheduler tick
or another submit writing, a waiting web worker slept through the release and past it, and
the API mix's p99 went to several hundred milliseconds (`bench/http_bench.py`).

So a transaction first takes a lock of its own, an advisory lock (flock) on a file beside the
database that every process of the ledger opens, before BEGIN IMMEDIATE; it polls that lock
every millisecond, and holds it until COMMIT or ROLLBACK (or the connection's close). Writers
queue on it instead of on SQLite's backoff, and BEGIN IMMEDIATE then finds the database free
but for a statement written outside any transaction, which SQLite's busy handler still waits
for. The kernel drops the lock of a process that dies. A writer that waits longer than the
database's `timeout` gets the error SQLite would give, "database is locked".

An in-memory database has no file beside it and one process; it gets Django's backend as is.

`turn` is the same kind of lock under another name, for work that must run one at a time
across every process of the ledger without holding the write lock all along (the scheduler's
tick: its reads run outside any transaction, so submits are not kept waiting on them).
"""

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from django.db import DEFAULT_DB_ALIAS, OperationalError, connections
from django.db.backends.sqlite3 import base

POLL_S = 0.001


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._writer_fd: int | None = None
        self._writer_for: tuple[str, int] | None = None  # (lock file, process)
        self._writing = False

    def _start_transaction_under_autocommit(self):
        self._take_writer_lock()
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # not in django-stubs
        except BaseException:
            self._release_writer_lock()
            raise

    def _commit(self):
        try:
            return super()._commit()  # type: ignore[misc]  # not in django-stubs
        finally:
            self._release_writer_lock()

    def _rollback(self):
        try:
            return super()._rollback()  # type: ignore[misc]  # not in django-stubs
        finally:
            self._release_writer_lock()

    def _close(self):
        try:
            return super()._close()  # type: ignore[misc]  # not in django-stubs
        finally:
            self._release_writer_lock()

    def _take_writer_lock(self) -> None:
        fd = self._writer_file()
        if fd is None or self._writing:
            return
        deadline = time.monotonic() + float(self.settings_dict["OPTIONS"].get("timeout", 5))
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OperationalError("database is locked") from None
                time.sleep(POLL_S)
        self._writing = True

    def _release_writer_lock(self) -> None:
        """Unlock, unless the lock was taken by the process this one was forked from: the
        descriptor is the parent's, and unlocking it would end the parent's hold."""
        if self._writing and self._writer_for is not None and self._writer_for[1] == os.getpid():
            fcntl.flock(self._writer_fd, fcntl.LOCK_UN)  # type: ignore[arg-type]
        self._writing = False

    def _writer_file(self) -> int | None:
        """The lock file's descriptor, opened once per connection object and process: its own
        open file description, so two threads of one process queue on it as two processes do,
        and a process forked with this object (a Celery pool's, a preloading server's) opens
        its own rather than share its parent's, which would let both in at once. None for an
        in-memory database. The name is read each time: the test runner swaps it."""
        if self.is_in_memory_db():
            return None
        opened_for = (_lock_path(self, "writer"), os.getpid())
        if self._writer_for != opened_for:
            if self._writer_fd is not None:
                os.close(self._writer_fd)  # a parent's lock stays its own
                self._writing = False
            self._writer_fd = _open_lock(opened_for[0])
            self._writer_for = opened_for
        return self._writer_fd


@contextlib.contextmanager
def turn(name: str, using: str = DEFAULT_DB_ALIAS) -> Iterator[bool | None]:
    """Whether this process holds the turn called `name` of the SQLite database `using`, a lock
    file beside it that the kernel drops with a process that dies: True inside while it is
    held, False when another process (or connection) holds it now, without waiting; None for an
    in-memory database, which has no file and one process."""
    connection = connections[using]
    assert isinstance(connection, base.DatabaseWrapper), "a turn is a SQLite database's"
    if connection.is_in_memory_db():
        yield None
        return
    fd = _open_lock(_lock_path(connection, name))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # ends the hold: the descriptor is this call's own


def _lock_path(connection: base.DatabaseWrapper, name: str) -> str:
    """The lock file called `name` beside the connection's database file."""
    return f"{connection.settings_dict['NAME']}-{name}.lock"


def _open_lock(path: str) -> int:
    """A descriptor of its own on the lock file at `path` (created when missing)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
