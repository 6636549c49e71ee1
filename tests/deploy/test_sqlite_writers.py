"""The embedded ledger's writers queue on a lock of their own (`starforge.db.sqlite3`): a
transaction waits for the one writing and starts as soon as that one ends, a wait past the
database's timeout is SQLite's own "database is locked", and a connection closed mid-write
lets the next writer in.

The connections are the backend's own, on a SQLite file of the test's, driven the way
`transaction.atomic` drives them (BEGIN through `_start_transaction_under_autocommit`, then
`commit` or `rollback`); each thread has its own, as Django gives them."""

import contextlib
import fcntl
import os
import threading
import time

import pytest
from django.db import OperationalError
from django.db.utils import ConnectionHandler


@pytest.fixture(autouse=True)
def _own_database(django_db_blocker):
    """These connections are to the test's own file, not the suite's database."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def ledger(tmp_path):
    made: list[ConnectionHandler] = []

    def connect(timeout: float = 30):
        """A connection of this thread, set up as the embedded default sets its ledger up."""
        handler = ConnectionHandler(
            {
                "default": {
                    "ENGINE": "starforge.db.sqlite3",
                    "NAME": str(tmp_path / "ledger.sqlite3"),
                    "OPTIONS": {
                        "transaction_mode": "IMMEDIATE",
                        "timeout": timeout,
                        "init_command": "PRAGMA journal_mode=WAL",
                    },
                }
            }
        )
        made.append(handler)
        return handler["default"]

    with connect().cursor() as cursor:
        cursor.execute("CREATE TABLE ledger (who TEXT)")
    yield connect
    for handler in made:
        handler.close_all()


@contextlib.contextmanager
def _transaction(connection):
    connection.ensure_connection()
    connection._start_transaction_under_autocommit()
    try:
        yield
    except BaseException:
        connection.rollback()
        raise
    connection.commit()


def _write(connection, who: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO ledger VALUES (%s)", [who])


def _written(connection) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT who FROM ledger ORDER BY rowid")
        return [who for (who,) in cursor.fetchall()]


def _in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def _holding_writer(ledger, seen: dict) -> tuple[threading.Thread, threading.Event]:
    """A thread that writes "first" in a transaction and holds it until the event is set
    (recording in `seen` when it goes on to commit); back once it holds the lock."""
    holding, release = threading.Event(), threading.Event()

    def first():
        connection = ledger()
        with _transaction(connection):
            _write(connection, "first")
            holding.set()
            release.wait(10)
            seen["first_committing"] = time.monotonic()

    thread = _in_thread(first)
    assert holding.wait(10)
    return thread, release


def test_a_second_writer_waits_for_the_first_and_begins_once_it_commits(ledger, tmp_path):
    seen: dict[str, float] = {}
    first, release = _holding_writer(ledger, seen)

    def second():
        connection = ledger()
        with _transaction(connection):
            seen["second_began"] = time.monotonic()
            _write(connection, "second")

    waiting = _in_thread(second)
    time.sleep(0.3)
    assert "second_began" not in seen, "a second writer began while the first held the lock"
    assert (tmp_path / "ledger.sqlite3-writer.lock").exists()
    release.set()
    for thread in (first, waiting):
        thread.join(10)
    assert seen["second_began"] > seen["first_committing"]
    assert _written(ledger()) == ["first", "second"]


def test_a_wait_past_the_timeout_is_database_is_locked_and_loses_nothing(ledger):
    thread, release = _holding_writer(ledger, {})
    waiting = ledger(timeout=0.2)
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            with _transaction(waiting):
                _write(waiting, "second")
    finally:
        release.set()
        thread.join(10)
    with _transaction(waiting):  # the refused writer is not left holding anything
        _write(waiting, "third")
    assert _written(waiting) == ["first", "third"]


def test_a_rolled_back_or_closed_writer_lets_the_next_one_in(ledger):
    one, other = ledger(timeout=1), ledger(timeout=1)
    with pytest.raises(RuntimeError):
        with _transaction(one):
            _write(one, "rolled back")
            raise RuntimeError("the job's submission failed")
    with _transaction(other):
        _write(other, "after the rollback")
    one._start_transaction_under_autocommit()
    _write(one, "never committed")
    one.close()  # the connection goes mid-write, as a killed worker's does
    with _transaction(other):
        _write(other, "after the close")
    assert _written(other) == ["after the rollback", "after the close"]


def test_a_process_forked_with_the_connection_keeps_out_of_its_parents_lock(ledger, tmp_path):
    """As a Celery pool's processes and a preloading web server's workers are forked: the
    child closes what it inherited (Celery's Django fixup does), which must not end the
    parent's hold, and then waits for the parent as any other writer does."""
    lock_file = tmp_path / "ledger.sqlite3-writer.lock"
    parent = ledger(timeout=0.3)
    with _transaction(parent):
        _write(parent, "parent")
        child = os.fork()
        if child == 0:  # pragma: no cover (the child's verdict is its exit status)
            code = 1
            try:
                parent.close()
                code = 0 if _held(lock_file) else 3
                parent._take_writer_lock()  # the lock alone: SQLite's own would refuse too
            except OperationalError as exc:
                code = code if "database is locked" in str(exc) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child let itself or others in"
        assert _held(lock_file), "the child's close ended the parent's hold"
        _write(parent, "parent, still holding")
    assert not _held(lock_file)
    assert _written(ledger()) == ["parent", "parent, still holding"]


def _held(lock_file) -> bool:
    """Whether some writer holds the lock, asked on a description of its own."""
    fd = os.open(lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_an_in_memory_database_takes_no_lock_file():
    handler = ConnectionHandler(
        {"default": {"ENGINE": "starforge.db.sqlite3", "NAME": ":memory:", "OPTIONS": {}}}
    )
    connection = handler["default"]
    try:
        with _transaction(connection):
            _write_table(connection)
        assert connection._writer_fd is None
    finally:
        handler.close_all()


def _write_table(connection) -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE ledger (who TEXT)")
        cursor.execute("INSERT INTO ledger VALUES ('one')")
