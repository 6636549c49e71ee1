"""Lending and taking lent GPUs back: the decisions, for the scheduler and the reconciler. It
writes nothing: `jobs.ledger.preemption` writes what it decides, `jobs.reads.preemption` reads
the borrowers and shows what was done (as the queue plan: `jobs.loops.queueplan` decides,
`jobs.stores.queueplan` keeps, `jobs.reads.queue` shows).

Borrowing (`lender`): a job past its own team's GPU quota, of a team with a borrow cap, may run
on a lendable team's idle quota: one with room for all its GPUs and no GPU job of its own
waiting, within the borrow cap; the one with the most room (then the first made).

Taking back (`take_back`): a lendable team's job that its own quota has room for, but that
waits because GPUs of that quota are lent out, preempts borrowers: only jobs on GPUs borrowed
from that team, the lowest priority first, then those that saved a checkpoint most recently,
then the most recently started, and never one whose attempt has run less than
SF_PREEMPT_MIN_RUNTIME_S. GPUs already coming back (notices sent, graces running) are counted
first. Each victim keeps its GPUs until it ends; it then goes PAUSED and the next tick queues
it again, to resume from its checkpoint.

A victim's end (`ends_preempted`, `gone_preempted`, `past_grace`): whatever its exit after the
notice, its end is the preemption's, unless it succeeded before the notice went out; one that
vanished from its engine after the notice went as told; one still up past its cluster's grace
is cancelled, tick after tick, until it ends.
"""

import datetime as dt
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from django.conf import settings

from jobs.durations import say
from jobs.ledger.preemption import Notice
from jobs.loops.holdings import Holdings
from jobs.models import Team
from jobs.reads.preemption import Borrower, borrowers
from jobs.states import JobStatus

S = JobStatus


@dataclass
class Lending:
    """One scheduler tick's lending: who borrows from whom, and the notices it decided."""

    now: dt.datetime
    teams: dict[int, Team]
    grace_s: Callable[[int], int]  # a cluster's preemption grace
    reachable: Collection[int]  # the clusters the tick reaches: notices go only there
    # Teams with a GPU job of their own in this tick's queue (they lend nothing), and the
    # lender each job past its quota would borrow from, as `lender` found.
    wanting: set[int] = field(default_factory=set)
    borrowing: dict[int, int] = field(default_factory=dict)
    # Jobs on borrowed GPUs by lender (read when a lender's job first wants its GPUs back),
    # GPUs per lender whose notice went out and that no waiting job has counted on yet, and
    # this tick's notices.
    borrowers: dict[int, list[Borrower]] | None = None
    coming_back: dict[int, int] = field(default_factory=dict)
    notices: list[Notice] = field(default_factory=list)
    notified: set[int] = field(default_factory=set)  # attempts this tick's notices name

    def borrowers_of(self, lender: int) -> list[Borrower]:
        if self.borrowers is None:
            self.borrowers = borrowers()
            for rows in self.borrowers.values():
                for row in rows:
                    if row.preempted_at is not None:
                        self.coming_back[row.lender] = (
                            self.coming_back.get(row.lender, 0) + row.total_gpus
                        )
        return self.borrowers.get(lender, [])


def lender(tick: Lending, held: Holdings, team: Team, total_gpus: int) -> Team | None:
    """The lendable team whose idle quota a job of `team` asking for `total_gpus`, past its
    own team's quota, may borrow them all from; None: it may not borrow."""
    if team.borrow_cap is None or not total_gpus:
        return None
    if held.borrowed[team.pk] + total_gpus > team.borrow_cap:
        return None
    room = {
        t.pk: t.gpu_quota - held.team[t.pk].total_gpus
        for t in tick.teams.values()
        if t.lendable and t.pk != team.pk and t.pk not in tick.wanting
    }
    fits = [pk for pk, free in room.items() if free >= total_gpus]
    if not fits:
        return None
    return tick.teams[max(fits, key=lambda pk: (room[pk], -pk))]


def borrow_words(held: Holdings, team: Team, total_gpus: int) -> str:
    """Why a team that may borrow does not, for the waiting reason."""
    if team.borrow_cap is None or not total_gpus:
        return ""
    borrowed = held.borrowed[team.pk]
    if borrowed + total_gpus > team.borrow_cap:
        return f" (it borrows {borrowed} of the {team.borrow_cap} GPUs it may borrow)"
    return " (no lendable team has that many idle GPUs)"


def take_back(
    tick: Lending, held: Holdings, team: Team, job: int, user: int, total_gpus: int
) -> str | None:
    """For a lendable team's job (`job` of `user`, asking for `total_gpus`) that its quota has
    room for but that lent GPUs keep out: borrowers of those GPUs get a notice (this tick's
    `tick.notices`), enough of them for the job, or none while too few may be preempted yet.
    The job's waiting reason, or None when lending is not what holds it back."""
    mine, lent = held.team[team.pk].total_gpus, held.lent[team.pk]
    if not team.lendable or not lent or not total_gpus or mine - lent + total_gpus > team.gpu_quota:
        return None
    member = held.member[(team.pk, user)]
    if team.user_gpu_cap is not None and member.total_gpus + total_gpus > team.user_gpu_cap:
        return None  # the member's cap holds it back whatever comes back
    short = mine + total_gpus - team.gpu_quota
    borrowing = tick.borrowers_of(team.pk)  # the first read also counts what is coming back
    coming = tick.coming_back.get(team.pk, 0)
    counted = min(coming, short)
    tick.coming_back[team.pk] = coming - counted
    short -= counted
    lent_words = f"{lent} of team {team.name}'s {team.gpu_quota} GPUs are lent to other teams"
    if short <= 0:
        return (
            f"waiting for lent GPUs: {lent_words}; the jobs on them have been preempted and "
            f"give them back by {_back_by(tick, borrowing):%H:%M:%S} UTC at the latest"
        )
    victims, freed, young = _victims(tick, borrowing, short)
    if freed < short:
        when = f"; the next may be preempted at {min(young):%H:%M:%S} UTC" if young else ""
        floor = say(settings.SF_PREEMPT_MIN_RUNTIME_S)
        return (
            f"waiting for lent GPUs: {lent_words}, and too few of the jobs on them have run "
            f"the minimum {floor} before they may be preempted{when}"
        )
    tick.notified.update(v.attempt for v in victims)
    tick.coming_back[team.pk] = freed - short
    tick.notices.append(Notice(job, team.name, victims))
    return (
        f"waiting for lent GPUs: {lent_words}; preempting {len(victims)} job(s) on them "
        f"({freed} GPUs), which have {say(tick.grace_s(victims[0].cluster))} to checkpoint"
    )


def _back_by(tick: Lending, borrowing: list[Borrower]) -> dt.datetime:
    """When the GPUs coming back from these borrowers are back at the latest."""
    return max(
        (
            (b.preempted_at or tick.now) + dt.timedelta(seconds=tick.grace_s(b.cluster))
            for b in borrowing
            if b.preempted_at or b.attempt in tick.notified
        ),
        default=tick.now,
    )


def _victims(
    tick: Lending, borrowing: list[Borrower], short: int
) -> tuple[list[Borrower], int, list[dt.datetime]]:
    """The borrowers to preempt for `short` GPUs, in victim order, and the GPUs they free (too
    few while too few have run the minimum), and when each of the others may be preempted."""
    floor = settings.SF_PREEMPT_MIN_RUNTIME_S
    # Those that may be told: up (their launch recorded), not told yet, on a cluster the tick
    # reaches.
    started = {
        b.attempt: b.started
        for b in borrowing
        if b.started is not None
        and b.job_ref
        and b.preempted_at is None
        and b.attempt not in tick.notified
        and b.cluster in tick.reachable
    }
    free = sorted((b for b in borrowing if b.attempt in started), key=Borrower.order)
    ripe = [b for b in free if (tick.now - started[b.attempt]).total_seconds() >= floor]
    victims, freed = [], 0
    for borrower in ripe:
        if freed >= short:
            break
        victims.append(borrower)
        freed += borrower.total_gpus
    young = [started[b.attempt] + dt.timedelta(seconds=floor) for b in free if b not in ripe]
    return victims, freed, young


def ends_preempted(notice: dt.datetime | None, target: JobStatus, end: dt.datetime | None) -> bool:
    """An attempt's end the engine reports as `target` (at `end`) is its preemption's: it was
    told (`notice`) and ended, whatever its exit, unless it succeeded before it was told."""
    if notice is None or target in (S.PENDING, S.RUNNING):
        return False
    return not (target == S.SUCCEEDED and end is not None and end <= notice)


def gone_preempted(notice: dt.datetime | None, last_seen: dt.datetime, now: dt.datetime) -> bool:
    """A preempted attempt its engine no longer knows (a Kubernetes Job deleted for it is gone
    once its pods are) went as it was told: its end, with no grace for an engine that may have
    lost it."""
    return notice is not None and now >= last_seen


def past_grace(notice: dt.datetime | None, grace_s: int, now: dt.datetime) -> bool:
    """A preempted attempt still up past its cluster's grace: cancelled until it ends."""
    return notice is not None and (now - notice).total_seconds() > grace_s
