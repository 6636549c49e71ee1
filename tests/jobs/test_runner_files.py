"""The runner's files as the executors read them: job code can write next to them (its working
directory is inside the attempt dir), so nonsense in them must not break a poll, and only a
record the attempt's runner signed decides anything."""

import fcntl
import json

import pytest

from jobs.executors.base import epoch, record_key, record_mac
from jobs.executors.local import LIVENESS_LOCK, LocalExecutor
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
