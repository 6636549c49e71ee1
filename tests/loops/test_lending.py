"""`jobs.loops.lending`, step by step: whom a job may borrow from, which borrowers give GPUs
back for a lender's job, and what a preempted attempt's observation means; it decides, and
writes nothing. Teams are plain rows; the holdings and borrowers are given, as a tick reads
them."""

import datetime as dt

import pytest

from jobs.loops import lending
from jobs.loops.holdings import Holdings
from jobs.models import Team
from jobs.reads.preemption import Borrower
from jobs.states import JobStatus

S = JobStatus
T0 = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)


def team(pk: int, name: str, quota: int, **fields) -> Team:
    return Team(pk=pk, name=name, gpu_quota=quota, **fields)


LAB = team(1, "lab", 8, lendable=True)
BIO = team(2, "bio", 8, lendable=True)
VISION = team(3, "vision", 0, borrow_cap=8)
TEAMS = {t.pk: t for t in (LAB, BIO, VISION)}


def tick(borrowers: list[Borrower] | None = None, **fields) -> lending.Lending:
    made = lending.Lending(T0, TEAMS, lambda cluster: 90, {7}, **fields)
    made.borrowers = {}
    for row in borrowers or []:
        made.borrowers.setdefault(row.lender, []).append(row)
        if row.preempted_at is not None:
            made.coming_back[row.lender] = made.coming_back.get(row.lender, 0) + row.total_gpus
    return made


def lent(*borrowers: Borrower) -> Holdings:
    held = Holdings()
    for row in borrowers:
        held.add(VISION.pk, 9, 7, row.total_gpus)
        held.lend(VISION.pk, row.lender, row.total_gpus)
    return held


def borrower(attempt: int, total_gpus: int, priority: int = 0, **fields) -> Borrower:
    row = {
        "job": 100 + attempt,
        "lender": LAB.pk,
        "cluster": 7,
        "job_ref": f"ref-{attempt}",
        "started": T0 - 60 * MIN,
        "checkpoint_at": None,
        "preempted_at": None,
    } | fields
    return Borrower(attempt=attempt, total_gpus=total_gpus, priority=priority, **row)


def test_a_job_borrows_from_the_lender_with_the_most_room_that_wants_none_itself():
    held = Holdings()
    held.add(LAB.pk, 1, 7, 4)
    assert lending.lender(tick(), held, VISION, 4) == BIO
    assert lending.lender(tick(wanting={BIO.pk}), held, VISION, 4) == LAB
    assert lending.lender(tick(wanting={BIO.pk}), held, VISION, 5) is None


def test_a_job_borrows_no_more_than_its_teams_cap():
    held = Holdings()
    held.lend(VISION.pk, BIO.pk, 6)
    assert lending.lender(tick(), held, VISION, 3) is None
    assert lending.borrow_words(held, VISION, 3) == " (it borrows 6 of the 8 GPUs it may borrow)"


def test_the_lowest_priority_borrowers_go_first_and_only_as_many_as_needed():
    rows = [borrower(1, 2, priority=5), borrower(2, 2, priority=-1), borrower(3, 2)]
    made = tick(rows)
    why = lending.take_back(made, lent(*rows), LAB, job=50, user=1, total_gpus=4)
    assert why == (
        "waiting for lent GPUs: 6 of team lab's 8 GPUs are lent to other teams; preempting "
        "1 job(s) on them (2 GPUs), which have 1 min 30 s to checkpoint"
    )
    assert [(n.job, n.lender, [v.attempt for v in n.victims]) for n in made.notices] == [
        (50, "lab", [2])
    ]
    assert made.notified == {2}


def test_gpus_already_coming_back_are_counted_before_another_notice(settings):
    rows = [borrower(1, 4, preempted_at=T0 - MIN), borrower(2, 4)]
    made = tick(rows)
    why = lending.take_back(made, lent(*rows), LAB, job=50, user=1, total_gpus=4)
    assert why == (
        "waiting for lent GPUs: 8 of team lab's 8 GPUs are lent to other teams; the jobs on "
        "them have been preempted and give them back by 12:00:30 UTC at the latest"
    )
    assert made.notices == []


def test_no_borrower_is_told_before_its_minimum_runtime(settings):
    settings.SF_PREEMPT_MIN_RUNTIME_S = 600
    rows = [borrower(1, 8, started=T0 - 4 * MIN)]
    made = tick(rows)
    why = lending.take_back(made, lent(*rows), LAB, job=50, user=1, total_gpus=1)
    assert why is not None and why.endswith("the next may be preempted at 12:06:00 UTC")
    assert made.notices == []


def test_a_borrower_on_a_cluster_the_tick_cannot_reach_is_never_a_victim():
    rows = [borrower(1, 8, cluster=8)]
    made = tick(rows)
    assert lending.take_back(made, lent(*rows), LAB, job=50, user=1, total_gpus=8) is not None
    assert made.notices == []


def test_lending_is_not_what_holds_back_a_lender_past_its_own_quota():
    rows = [borrower(1, 4)]
    assert lending.take_back(tick(rows), lent(*rows), LAB, job=50, user=1, total_gpus=9) is None


@pytest.mark.parametrize(
    ("target", "end", "paused"),
    [
        (S.RUNNING, None, False),  # still up: its grace runs
        (S.FAILED, T0 + MIN, True),  # SIGTERM'd, exited non-zero
        (S.SUCCEEDED, T0 + MIN, True),  # exited 0 after its notice: still the preemption's
        (S.SUCCEEDED, T0 - MIN, False),  # succeeded before it was told: a success
        (S.STOPPED, None, True),
    ],
)
def test_what_a_preempted_attempts_end_means(target, end, paused):
    assert lending.ends_preempted(T0, target, end) is paused
    assert lending.ends_preempted(None, target, end) is False  # never told


def test_a_preempted_attempt_is_cancelled_past_its_grace_and_gone_once_unseen():
    assert not lending.past_grace(T0, 90, T0 + 90 * dt.timedelta(seconds=1))
    assert lending.past_grace(T0, 90, T0 + 91 * dt.timedelta(seconds=1))
    assert not lending.past_grace(None, 90, T0 + 10 * MIN)
    assert lending.gone_preempted(T0, T0 + MIN, T0 + MIN)
    assert not lending.gone_preempted(None, T0, T0 + 10 * MIN)
