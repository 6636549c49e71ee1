"""The chaos suite's short form for CI: a few kills of every kind while 40 jobs run, and the
lender taking its GPUs back from borrowers meanwhile (at least one preemption per executor).

`make chaos` runs the full form (300 jobs per executor); see tests/chaos/driver.py.
"""

import shutil

import pytest

from tests.chaos import driver

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.postgres]


def assert_held(result: driver.Result) -> None:
    print(result.line(), result.kills_by_kind, f"{result.seconds:.0f} s")
    assert result.violations == []  # check_ledger's and the round's own (tests.chaos.invariants)
    assert result.died == {}  # no process of the stack ended by itself
    assert result.not_final == []
    assert result.kills >= 8
    assert result.figures.preempted >= 1  # the lender took its GPUs back under the faults


def test_local_jobs_all_end_and_the_ledger_holds_while_processes_are_killed():
    result = driver.run("local", jobs=40, duration=50, interval=3, settle_timeout=120)
    assert_held(result)
    assert result.figures.borrowed > 0  # red ran on GPUs lent by gold or blue
    assert result.kills_by_kind.keys() >= {"worker", "beat", "beat2", "web", "websocket", "redis"}


@pytest.mark.slurm
@pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm is not installed")
def test_slurm_jobs_all_end_and_the_ledger_holds_while_slurmctld_is_killed_too():
    result = driver.run("slurm", jobs=24, duration=40, interval=3, settle_timeout=120)
    assert_held(result)
    assert "slurmctld" in result.kills_by_kind
