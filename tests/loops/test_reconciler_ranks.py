"""The reconciler and the ranks of a multi-node attempt, driven by a scripted executor: what
it keeps of each rank, the failure reason naming the rank that failed first, and a partial
start meeting the pending deadline."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.executors import Observation
from jobs.loops.reconciler import reconcile_all
from jobs.models import Attempt, Job
from jobs.reads.diagnostics import explain
from jobs.states import JobStatus
from jobs.stores import logstore
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus


def rank(index: int, state: str, code=None, node=None) -> dict:
    return {"rank": index, "node": node or f"n{index + 1}", "state": state, "exit_code": code}


@pytest.fixture
def gang(team, alice):
    job = queued_job(team, alice, total_gpus=8, nodes=2, pending_deadline_s=60)
    attempt = with_attempt(job, S.PENDING, job_ref="ref-g", nodes=2, pending_at=timezone.now())
    return job, attempt


def test_the_ranks_the_engine_reports_are_kept_on_the_attempt(backend, gang):
    job, attempt = gang
    ranks = [rank(0, "running"), rank(1, "running")]
    backend.states["ref-g"] = Observation(
        "RUN", start_time=timezone.now(), details={"ranks": ranks}
    )
    reconcile_all()
    assert Attempt.objects.get(pk=attempt.pk).ranks == ranks
    assert Job.objects.get(pk=job.pk).status == S.RUNNING


def test_the_failure_names_the_rank_that_failed_first_with_its_own_last_lines(backend, gang):
    job, attempt = gang
    logstore.append(
        job.pk,
        1,
        [
            {"seq": 0, "stream": "stdout", "ts": 1.0, "text": "rank 0 step 9", "rank": 0},
            {"seq": 1, "stream": "stderr", "ts": 2.0, "text": "CUDA error", "rank": 1},
            {"seq": 2, "stream": "stdout", "ts": 3.0, "text": "rank 0 step 10", "rank": 0},
        ],
    )
    ranks = [rank(0, "killed", -15), rank(1, "failed", 7, node="gpu-b")]
    backend.states["ref-g"] = Observation(
        "BAD",
        exit_code=7,
        start_time=timezone.now(),
        details={"ranks": ranks, "failed_rank": 1},
    )
    reconcile_all()
    job.refresh_from_db()
    assert job.status == S.FAILED
    assert job.status_reason == (
        "rank 1 on gpu-b exited with code 7; every other rank was ended; its last lines:\n"
        "CUDA error"
    )
    sentences = explain(job)
    assert "Rank 0 on n1: killed, exit code -15." in sentences
    assert "Rank 1 on gpu-b: failed, exit code 7." in sentences


def test_a_partial_start_past_the_deadline_fails_saying_not_all_nodes_started(backend, gang):
    job, attempt = gang
    ranks = [rank(0, "running"), rank(1, "pending")]
    backend.states["ref-g"] = Observation("QUEUED", details={"ranks": ranks})
    reconcile_all(now=timezone.now() + dt.timedelta(seconds=30))
    assert Job.objects.get(pk=job.pk).status == S.PENDING
    reconcile_all(now=timezone.now() + dt.timedelta(seconds=61))
    job.refresh_from_db()
    assert job.status == S.FAILED
    assert job.status_reason == (
        "not all nodes started: 1 of 2 ranks running after the pending deadline of 60 s; "
        "every started rank was cancelled"
    )
    assert backend.cancelled == ["ref-g"]
    assert Attempt.objects.get(pk=attempt.pk).start_time is None  # nothing billed


def test_a_rank_that_no_longer_says_its_node_keeps_the_one_seen_before(backend, gang):
    job, attempt = gang
    backend.states["ref-g"] = Observation(
        "RUN",
        start_time=timezone.now(),
        details={"ranks": [rank(0, "running"), rank(1, "running")]},
    )
    reconcile_all()
    gone = [rank(0, "failed", 3), {**rank(1, "killed"), "node": ""}]
    backend.states["ref-g"] = Observation(
        "BAD", exit_code=3, start_time=timezone.now(), details={"ranks": gone, "failed_rank": 0}
    )
    reconcile_all()
    nodes = [r["node"] for r in Attempt.objects.get(pk=attempt.pk).ranks]
    assert nodes == ["n1", "n2"]
