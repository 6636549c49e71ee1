"""The chaos round's own checks catch what they are for: each fed a ledger dump (and a journal)
that breaks one rule reports it, and a clean preemption passes and is counted. No stack: the
rows are made here, as `tests.chaos.invariants.LEDGER` prints them."""

import datetime as dt

from tests.chaos import invariants
from tests.chaos.invariants import Figures, Ledger

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def attempt(job: int, number: int, start: float, end: float | None, **extra) -> dict:
    row = {
        "job_id": job,
        "number": number,
        "job__team__name": "red",
        "borrowed_from__name": "gold",
        "gpus": 2,
        "submitted_at": at(start - 1),
        "start_time": at(start),
        "end_time": None if end is None else at(end),
        "preempted_at": None,
        "end_reason": "",
        "metered": end is not None,
    }
    return {**row, **extra}


def event(seconds: float, kind: str, to_status: str = "", reason: str = "") -> dict:
    return {
        "job_id": 1,
        "time": at(seconds),
        "kind": kind,
        "to_status": to_status,
        "reason": reason,
    }


def usage(attempts: list[dict]) -> list[dict]:
    """The records metering would have written for these attempts: each billed once."""
    rows = []
    for a in attempts:
        if a["start_time"] and a["end_time"]:
            us = (a["end_time"] - a["start_time"]) // dt.timedelta(microseconds=1) * a["gpus"]
            lent = us if a["borrowed_from__name"] else 0
            rows.append({"team__name": a["job__team__name"], "gpu_us": us, "deleted_gpu_us": 0,
                         "borrowed_gpu_us": lent})  # fmt: skip
    return rows


def ledger(attempts: list[dict], events: list[dict], usage_rows: list[dict] | None = None):
    teams = {
        "red": {"name": "red", "gpu_quota": 1, "borrow_cap": 2},
        "gold": {"name": "gold", "gpu_quota": 2, "borrow_cap": None},
    }
    by_job: dict[int, list[dict]] = {}
    for a in attempts:
        by_job.setdefault(a["job_id"], []).append(a)
    return Ledger(
        2, teams, by_job, {1: events}, usage(attempts) if usage_rows is None else usage_rows
    )


NOTICE = "preemption notice: the lending team needs back the 2 GPUs this job borrowed"
PAUSED = "preempted: borrowed GPUs returned to the lending team"
REQUEUED = "resuming after preemption; waiting for the scheduler"


def preempted_once() -> tuple[list[dict], list[dict]]:
    """Job 1 borrows gold's 2 GPUs, is told at 10 s, PAUSED at 12 s, queued, resumes at 15 s;
    gold's job 2 runs from 13 s."""
    attempts = [
        attempt(1, 1, 0, 12, preempted_at=at(10), end_reason=PAUSED),
        attempt(1, 2, 15, 30),
        attempt(2, 1, 13, 14, job__team__name="gold", borrowed_from__name=None),
    ]
    events = [
        event(0, "status", "RUNNING"),
        event(10.1, "note", reason=NOTICE),
        event(12, "status", "PAUSED", PAUSED),
        event(12.5, "status", "QUEUED", REQUEUED),
        event(15, "status", "RUNNING"),
        event(30, "status", "SUCCEEDED"),
    ]
    return attempts, events


def test_a_preemption_noticed_paused_and_resumed_passes_and_is_counted():
    attempts, events = preempted_once()
    figures = Figures()
    found = invariants.preemptions(ledger(attempts, events), figures)
    assert found == []
    assert (figures.borrowed, figures.preempted, figures.paused, figures.resumed) == (2, 1, 1, 1)
    assert invariants.billing(ledger(attempts, events)) == []
    assert invariants.quotas_over_time(ledger(attempts, events)) == []


def test_a_preemption_without_its_notice_is_reported():
    attempts, events = preempted_once()
    events = [e for e in events if e["kind"] != "note"]
    found = invariants.preemptions(ledger(attempts, events), Figures())
    assert found == ["job 1: 1 preempted attempt(s) but 0 preemption notice(s) in its events"]


def test_a_preempted_job_left_paused_is_reported():
    attempts, events = preempted_once()
    found = invariants.preemptions(ledger(attempts[:1], events[:3]), Figures())
    assert found == ["job 1 attempt 1: PAUSED by its preemption and never queued again"]


def test_a_preempted_attempt_that_succeeded_after_its_notice_is_reported():
    attempts, events = preempted_once()
    events[2] = event(12, "status", "SUCCEEDED", "")
    found = invariants.preemptions(ledger(attempts[:1], events[:3]), Figures())
    assert found == ["job 1 attempt 1: SUCCEEDED at 12:00:12.000000, after its notice: not PAUSED"]


def test_a_preemption_before_the_minimum_runtime_is_reported():
    attempts, events = preempted_once()
    attempts[0]["preempted_at"] = at(1)
    events[1] = event(1.1, "note", reason=NOTICE)
    found = invariants.preemptions(ledger(attempts, events), Figures())
    assert found == [
        "job 1 attempt 1: preempted at 12:00:01.000000 but it ran 1.0 s, under the minimum"
    ]


def test_an_attempt_billed_twice_is_reported():
    attempts, events = preempted_once()
    twice = usage(attempts) + usage(attempts[:1])
    found = invariants.billing(ledger(attempts, events, twice))
    assert found == ["team red: billed 78000000 GPU-µs (78000000 borrowed), its attempts ran "
                     "54000000 (54000000 borrowed)"]  # fmt: skip


def test_an_ended_attempt_left_unmetered_is_reported():
    attempts, events = preempted_once()
    attempts[1]["metered"] = False
    found = invariants.billing(ledger(attempts, events, usage(attempts[:1] + attempts[2:])))
    assert found == ["job 1 attempt 2: ended but not metered"]


def test_a_lender_job_started_before_the_borrower_gave_its_gpus_back_is_reported():
    attempts, events = preempted_once()
    attempts[2]["start_time"] = at(11)
    found = invariants.quotas_over_time(ledger(attempts, events))
    assert found == ["team gold: 4 GPUs on its quota (2) at 12:00:11.000000, when job 2 attempt 1 "
                     "started"]  # fmt: skip


def journal(*lines: tuple[int, str, int]) -> list[dict]:
    return [{"attempt": a, "event": e, "step": s} for a, e, s in lines]


def test_a_journal_resumed_from_the_notice_checkpoint_passes_and_is_counted():
    attempts, _ = preempted_once()
    lines = journal((1, "start", 0), (1, "save", 5), (1, "save", 7), (1, "notice", 7),
                    (2, "start", 7), (2, "save", 10), (2, "done", 20))  # fmt: skip
    figures = Figures()
    found = invariants.check_journal(1, lines, {a["number"]: a for a in attempts[:2]}, figures)
    assert found == []
    assert (figures.noticed, figures.from_checkpoint) == (1, 1)


def test_attempts_alive_at_once_or_a_resume_past_the_checkpoint_are_reported():
    attempts, _ = preempted_once()
    lines = journal((1, "start", 0), (1, "save", 5), (2, "start", 7), (1, "save", 10))
    found = invariants.check_journal(1, lines, {a["number"]: a for a in attempts[:2]}, Figures())
    assert found == [
        "job 1: attempt 2 started from step 7, but the last step saved was 5",
        "job 1: attempt 1 wrote save after 2 began",
    ]
