"""A person's work in a team once they may no longer submit there (docs/ARCHITECTURE.md,
"Membership bounds a member's reach"): what waits is stopped with a sentence saying why, so
it never runs as the team's; what already runs goes on as the team's work, with a note on
each job, and `jobs.reads.outsiders.inherited` lists it for the team's admins.

"What waits" is every job that would run later without anyone asking again: QUEUED (array
tasks included), PAUSED (a window or a preemption queues it again by itself) and FAILED with
a pending automatic retry (FAILED → STOPPED cancels it).

Two doors lead here. `jobs.signals` calls `member_left` and `user_deactivated` inside the
transaction that deletes the membership or deactivates the user, whoever does it (team API,
console, Django admin, a script). The scheduler calls `stop_outsiders` before it admits, on
every tick: the check that catches what no signal sees (an UPDATE in SQL, a member made a
viewer, a follow-on or a retry that queued an outsider's job afterwards).
"""

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet
from django.utils import timezone

from jobs.ledger.halt import halt
from jobs.models import Job, JobEvent, Team
from jobs.reads.outsiders import described
from jobs.states import JobStatus

S = JobStatus
ACTOR = "membership"
WAITING = Q(status__in=[S.QUEUED, S.PAUSED]) | Q(status=S.FAILED, next_attempt_at__isnull=False)


@dataclass(frozen=True)
class Departed:
    stopped: list[int]  # waiting jobs stopped
    noted: list[int]  # running jobs that go on as the team's, each with a note


def member_left(user_id: int, team_id: int, now: dt.datetime | None = None) -> Departed:
    """The user is no longer in the team: their waiting work in it stops."""
    username = _username(user_id)
    team = Team.objects.filter(pk=team_id).values_list("name", flat=True).first()
    return _end(
        Job.objects.filter(user_id=user_id, team_id=team_id),
        f"{username} is no longer a member of team {team}",
        now or timezone.now(),
    )


def user_deactivated(user_id: int, now: dt.datetime | None = None) -> Departed:
    """The user's account was deactivated: their waiting work stops in every team."""
    return _end(
        Job.objects.filter(user_id=user_id),
        f"{_username(user_id)}'s account was deactivated",
        now or timezone.now(),
    )


def stop_outsiders(now: dt.datetime) -> list[int]:
    """Admission's re-check: stop the QUEUED jobs whose submitter may no longer submit in the
    job's team. One query when there are none, as on almost every tick."""
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job in described(Job.objects.filter(status=S.QUEUED)):
        by_reason[f"stopped at admission: {job.why}; it does not run as the team's work"].append(
            job.job_id
        )
    return [
        pk
        for reason, ids in by_reason.items()
        for pk in halt(
            ids, S.STOPPED, reason, actor="scheduler", now=now, expected={S.QUEUED}
        ).halted
    ]


def _end(jobs: QuerySet[Job], why: str, now: dt.datetime) -> Departed:
    waiting = list(jobs.filter(WAITING).order_by("pk").values_list("pk", flat=True))
    stopped = halt(
        waiting,
        S.STOPPED,
        f"stopped: {why}; their waiting work does not run as the team's",
        actor=ACTOR,
        now=now,
        # A job admitted meanwhile runs on as the team's; the check below notes it.
        expected={S.QUEUED, S.PAUSED, S.FAILED},
    ).halted
    running = list(jobs.filter(status__in=S.active()).order_by("pk").values_list("pk", flat=True))
    note = f"{why}: this job goes on as the team's work; a team admin may stop it"
    JobEvent.objects.bulk_create(
        JobEvent(job_id=pk, kind=JobEvent.Kind.NOTE, actor=ACTOR, reason=note, time=now)
        for pk in running
    )
    return Departed(stopped, running)


def _username(user_id: int) -> str:
    return User.objects.filter(pk=user_id).values_list("username", flat=True).first() or "?"
