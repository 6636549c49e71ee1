"""The runner's files as the executors read them: job code can write next to them (its working
directory is inside the attempt dir), so nonsense in them must not break a poll."""

import json

import pytest

from jobs.executors.base import epoch
from jobs.executors.local import LocalExecutor
from jobs.models import Cluster


@pytest.mark.parametrize("value", [None, 0, "1700000000", True, 1e300, -1e300, float("nan"), [1]])
def test_anything_but_a_sane_epoch_is_no_time(value):
    assert epoch(value) is None


def test_a_sane_epoch_is_an_aware_datetime():
    assert epoch(1_700_000_000.5).isoformat() == "2023-11-14T22:13:20.500000+00:00"


def test_a_forged_exit_file_on_the_local_executor_is_a_failure_without_a_code(settings, tmp_path):
    settings.SF_LOCAL_STATE_DIR = tmp_path
    executor = LocalExecutor(Cluster(name="local", kind="local"))
    attempt_dir = executor.root / "sf-forged-a1"
    attempt_dir.mkdir()
    forged = {"exit_code": "0", "reason": 7, "started_at": 1e300, "ended_at": "soon"}
    (attempt_dir / "exit.json").write_text(json.dumps(forged))
    (attempt_dir / "started.json").write_text(json.dumps({"started_at": [1]}))
    obs = executor.poll(["sf-forged-a1"])["sf-forged-a1"]
    assert (obs.native_state, obs.exit_code, obs.failure) == ("FAILED", None, "exit")
    assert (obs.start_time, obs.end_time, obs.message) == (None, None, "7")
