"""The runner's files as the executors read them: job code can write next to them (its working
directory is inside the attempt dir), so nonsense in them (a FIFO, a link) must not break or
block a poll, and only a record the attempt's runner signed decides anything. A poll only looks:
the processes a dead runner left are ended by `reap_stale`, which the reconciler calls after it."""

import fcntl
import json
import os
import signal
import subprocess
import sys

import pytest
from sf.contract import EXIT_FILE, LIVENESS_LOCK, STARTED_FILE

from jobs.executors import Observation
from jobs.executors.base import epoch, record_key, record_mac
from jobs.executors.local import LocalExecutor
from jobs.models import Cluster


@pytest.mark.parametrize("value", [None, 0, "1700000000", True, 1e300, -1e300, float("nan"), [1]])
def test_anything_but_a_sane_epoch_is_no_time(value):
    assert epoch(value) is None


def test_a_sane_epoch_is_an_aware_datetime():
    assert epoch(1_700_000_000.5).isoformat() == "2023-11-14T22:13:20.500000+00:00"


@pytest.fixture
def attempt_dir(settings, tmp_path):
    settings.SF_LOCAL_STATE_DIR = tmp_path
    executor = LocalExecutor(Cluster(name="local", kind="local"))
    path = executor.root / "sf-forged-a1"
    path.mkdir()
    return path


def poll(attempt_dir):
    executor = LocalExecutor(Cluster(name="local", kind="local"))
    return executor.poll([attempt_dir.name])[attempt_dir.name]


def signed(record: dict, name: str = "sf-forged-a1") -> str:
    return json.dumps({**record, "mac": record_mac(record_key(name), record)})


def test_an_unsigned_exit_file_decides_nothing(attempt_dir):
    forged = {"exit_code": 0, "reason": "", "started_at": 1_700_000_000, "ended_at": 1_700_000_001}
    (attempt_dir / "exit.json").write_text(json.dumps(forged))
    (attempt_dir / "started.json").write_text(json.dumps({"started_at": 1_700_000_000}))
    obs = poll(attempt_dir)
    assert (obs.native_state, obs.exit_code, obs.start_time) == ("DIED", None, None)
    assert obs.message == "the runner is gone and left no exit status it signed"


def test_a_record_signed_for_another_attempt_decides_nothing(attempt_dir):
    record = {"exit_code": 0, "reason": "", "started_at": 1.0, "ended_at": 2.0}
    (attempt_dir / "exit.json").write_text(signed(record, name="sf-other-a1"))
    assert poll(attempt_dir).native_state == "DIED"


def test_a_signed_exit_file_decides_the_outcome_and_times(attempt_dir):
    record = {"exit_code": 3, "reason": "", "started_at": 1_700_000_000, "ended_at": 1_700_000_009}
    (attempt_dir / "exit.json").write_text(signed(record))
    obs = poll(attempt_dir)
    assert (obs.native_state, obs.exit_code) == ("FAILED", 3)
    assert (obs.end_time - obs.start_time).total_seconds() == 9


def test_nonsense_in_a_signed_exit_file_is_a_failure_without_a_code(attempt_dir):
    (attempt_dir / "exit.json").write_text(
        signed({"exit_code": "0", "reason": 7, "started_at": 1e300, "ended_at": "soon"})
    )
    (attempt_dir / "started.json").write_text(signed({"started_at": [1]}))
    obs = poll(attempt_dir)
    assert (obs.native_state, obs.exit_code, obs.failure) == ("FAILED", None, "exit")
    assert (obs.start_time, obs.end_time, obs.message) == (None, None, "7")


def test_while_the_runner_holds_its_lock_even_a_signed_exit_file_waits(attempt_dir):
    record = {"exit_code": 0, "reason": "", "started_at": 1.0, "ended_at": 2.0}
    (attempt_dir / "exit.json").write_text(signed(record))
    (attempt_dir / "started.json").write_text(signed({"started_at": 1_700_000_000, "pid": 1}))
    with open(attempt_dir / LIVENESS_LOCK, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        # flock locks belong to the open file: a second open in this process is refused too.
        assert poll(attempt_dir).native_state == "RUNNING"
    assert poll(attempt_dir).native_state == "SUCCEEDED"


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_fifo_or_a_link_in_place_of_a_record_decides_nothing_and_never_blocks(
    attempt_dir, tmp_path, kind
):
    record = {"exit_code": 0, "reason": "", "started_at": 1.0, "ended_at": 2.0}
    for name in (EXIT_FILE, STARTED_FILE):
        if kind == "fifo":  # a poll that opened it plainly would wait for a writer forever
            os.mkfifo(attempt_dir / name)
        else:  # a good record elsewhere, linked in by job code
            (tmp_path / name).write_text(signed(record))
            (attempt_dir / name).symlink_to(tmp_path / name)
    assert poll(attempt_dir).native_state == "DIED"


@pytest.fixture
def orphan():
    """A job's process group whose runner is gone: nothing supervises it any more."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_poll_only_marks_the_job_a_dead_runner_left_and_reap_stale_ends_it(attempt_dir, orphan):
    started = {"started_at": 1_700_000_000, "pid": orphan.pid}
    (attempt_dir / STARTED_FILE).write_text(signed(started))
    executor = LocalExecutor(Cluster(name="local", kind="local"))
    obs = executor.poll([attempt_dir.name])[attempt_dir.name]
    # The attempt stays open while the job's processes live, and the poll kills nothing.
    assert (obs.native_state, obs.details) == ("RUNNING", {"orphaned_group": orphan.pid})
    assert poll(attempt_dir).native_state == "RUNNING" and orphan.poll() is None
    # Only what a poll marked is reaped.
    assert executor.reap_stale({attempt_dir.name: Observation("RUNNING")}) == []
    assert orphan.poll() is None
    assert executor.reap_stale({attempt_dir.name: obs}) == [attempt_dir.name]
    assert orphan.wait(timeout=10) == -signal.SIGKILL
    assert poll(attempt_dir).native_state == "DIED"
    assert executor.reap_stale({attempt_dir.name: obs}) == []  # gone: nothing left to end


def test_reap_stale_checks_again_that_the_runner_is_gone(attempt_dir, orphan):
    (attempt_dir / STARTED_FILE).write_text(signed({"started_at": 1.0, "pid": orphan.pid}))
    executor = LocalExecutor(Cluster(name="local", kind="local"))
    obs = executor.poll([attempt_dir.name])[attempt_dir.name]
    with open(attempt_dir / LIVENESS_LOCK, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a runner holds the lock again: it supervises the job
        assert executor.reap_stale({attempt_dir.name: obs}) == []
    assert orphan.poll() is None
