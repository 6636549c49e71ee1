"""Why an attempt failed (`sf.contract.Failure`): the causes the ledger keeps, which of them an
automatic retry follows, what an engine's own time limit becomes, and the same strings the
ledger stored and the API answered before the causes had a name."""

import pytest
from sf.contract import Failure


def test_the_causes_keep_the_strings_the_ledger_stores():
    assert [cause.value for cause in Failure] == [
        "exit",
        "oom",
        "lost",
        "preempted",
        "ingest",
        "deadline",
        "rejected",
        "timeout",
        "hung",
    ]
    assert Failure.LOST == "lost" and Failure("oom") is Failure.OOM


def test_a_cause_reads_as_its_value_in_a_sentence():
    assert f"{Failure.INGEST} failures are not retried" == "ingest failures are not retried"
    assert str(Failure.DEADLINE) == "deadline"


def test_a_retry_follows_the_causes_a_second_run_could_escape():
    assert Failure.retryable() == {"exit", "oom", "lost", "preempted", "hung"}


@pytest.mark.parametrize("cause", ["ingest", "rejected", "deadline", ""])
def test_no_retry_follows_a_cause_that_would_fail_again_or_none(cause):
    assert cause not in Failure.retryable()


def test_an_engines_own_time_limit_is_a_timeout_or_a_deadline():
    assert Failure.time_limits() == {"timeout", "deadline"}


def test_the_ledger_keeps_every_cause_but_the_engines_timeout():
    assert Failure.recorded() == tuple(c for c in Failure if c != "timeout")


@pytest.mark.parametrize(
    "observed, kept",
    [
        ("", Failure.EXIT),  # the engine named no cause: the entrypoint's exit
        ("timeout", Failure.EXIT),  # a partition's limit, not the job's: retryable
        ("exit", Failure.EXIT),
        ("oom", Failure.OOM),
        ("lost", Failure.LOST),
        ("deadline", Failure.DEADLINE),
        ("ingest", Failure.INGEST),
    ],
)
def test_the_ledger_keeps_a_failure_as_its_cause_a_timeout_as_an_exit(observed, kept):
    assert Failure.recorded_as(observed) is kept
    assert Failure.recorded_as(observed) in Failure.recorded()
