"""What a multi-node job's runner (or anything holding its token) may say about ranks.

A log line may name its rank, but only one of its attempt's ranks; the rows the ledger keeps
per rank come from the runner's signed records or the engine, checked, never as a job wrote
them."""

import json

import pytest

from jobs.loops.reconciler import checked_ranks
from jobs.models import Attempt, Job, LogStream
from jobs.stores import logstore
from tests.api_helpers import assert_refused, submit
from tests.ingesting import attach_attempt, runner

pytestmark = pytest.mark.django_db
T0 = 1_700_000_000.0


def lines(*ranks) -> dict:
    rows = [
        {"seq": seq, "stream": "stdout", "ts": T0, "text": f"from {rank}", "rank": rank}
        for seq, rank in enumerate(ranks)
    ]
    return {"attempt": 1, "lines": rows}


@pytest.fixture
def gang_attempt(api) -> Attempt:
    job_id = submit(api)
    attempt = attach_attempt(job_id, 1)
    Attempt.objects.filter(pk=attempt.pk).update(nodes=2)
    Job.objects.filter(pk=job_id).update(nodes=2, total_gpus=2)
    return attempt


def post(job_id: int, body: dict):
    return runner(job_id).post("/api/v1/ingest/logs", json.dumps(body), "application/json")


def test_lines_keep_the_rank_that_wrote_them(gang_attempt):
    assert post(gang_attempt.job_id, lines(0, 1, 1)).status_code == 200
    stored = [json.loads(r) for r in logstore.read(gang_attempt.job_id, None, 10).raw_lines]
    assert [(ln["rank"], ln["text"]) for ln in stored] == [(0, "from 0"), (1, "from 1")] + [
        (1, "from 1")
    ]


@pytest.mark.parametrize("rank", [2, -1, "1", True, 1.0, None])
def test_a_rank_the_attempt_does_not_have_is_refused_and_nothing_is_stored(gang_attempt, rank):
    response = post(gang_attempt.job_id, lines(0, rank))
    assert_refused(response, 400, "this attempt has ranks 0 to 1")
    assert not LogStream.objects.filter(job_id=gang_attempt.job_id, next_seq__gt=0).exists()


def test_a_single_node_attempt_takes_no_rank_but_0(api):
    job_id = submit(api)
    attach_attempt(job_id, 1)
    assert_refused(post(job_id, lines(1)), 400, "this attempt has ranks 0 to 0")


@pytest.mark.parametrize(
    "rows",
    [
        [{"rank": 0, "node": "n1", "state": "running", "exit_code": None}],  # one row short
        [{"rank": 0, "node": "n1", "state": "running"}, {"rank": 0, "node": "n2", "state": "x"}],
        [{"rank": 0, "node": 5, "state": "running"}, {"rank": 1, "node": "n", "state": "running"}],
        [
            {"rank": 0, "node": "n1", "state": "failed", "exit_code": "3"},
            {"rank": 1, "node": "n2", "state": "running", "exit_code": None},
        ],
        "not a list",
        [["rank", 0], ["rank", 1]],
    ],
)
def test_rank_rows_that_are_not_one_checked_row_per_rank_are_not_kept(rows):
    assert checked_ranks(rows, 2) == []


def test_rank_rows_are_kept_in_rank_order_with_long_node_names_cut():
    rows = [
        {"rank": 1, "node": "n" * 500, "state": "killed", "exit_code": -15, "extra": "x"},
        {"rank": 0, "node": "n1", "state": "failed", "exit_code": 3},
    ]
    assert checked_ranks(rows, 2) == [
        {"rank": 0, "node": "n1", "state": "failed", "exit_code": 3},
        {"rank": 1, "node": "n" * 100, "state": "killed", "exit_code": -15},
    ]
