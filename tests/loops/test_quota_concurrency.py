"""Issue 6 on real PostgreSQL: two schedulers at once never let a team exceed any of its quotas.

500 jobs from 5 teams with small quotas (GPUs, job slots, a per-member GPU cap, a share of the
cluster) are admitted by two scheduler threads at once, each launching what it admitted on a
scripted 24-GPU engine, while a finisher thread starts and ends launched jobs (SUCCEEDED or
FAILED) so slots keep freeing up. A sampler reads what every team holds, each sample in one
statement (one snapshot). No sample, no admission in the replayed JobEvent timeline, and no
line of `check_ledger` may show a team over a quota or the cluster over its capacity.
"""

import math
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count, F, Sum
from django.utils import timezone

from jobs.executors import Capacity
from jobs.ledger.transitions import Change, apply_transitions
from jobs.loops.launcher import launch_attempts
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Cluster, ClusterShare, Job, JobEvent, Membership, Team
from jobs.reads import ledgercheck
from jobs.states import JobStatus
from tests.scripted import ScriptedExecutor
from tests.threads import looping

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = JobStatus
CAPACITY = 24
JOBS_PER_TEAM = 100
MEMBERS = 3
DEADLINE_S = 60


@dataclass(frozen=True)
class Quota:
    gpus: int
    jobs: int | None = None  # Team.max_jobs
    member_gpus: int | None = None  # Team.user_gpu_cap
    share: int | None = None  # ClusterShare.percent on the one cluster

    @property
    def share_gpus(self) -> int | None:
        return None if self.share is None else math.floor(CAPACITY * self.share / 100)

    @property
    def largest_job(self) -> int:
        """The largest job that can ever start: a bigger one would wait forever."""
        limits = [4, self.gpus, self.member_gpus, self.share_gpus]
        return min(limit for limit in limits if limit is not None)


# Each team has a different quota binding first; together they want more than the cluster has.
QUOTAS = {
    "atlas": Quota(gpus=8, jobs=4, member_gpus=4, share=50),  # slots
    "borealis": Quota(gpus=10, jobs=6, member_gpus=3, share=25),  # share: 6 of 24 GPUs
    "cygnus": Quota(gpus=6),  # GPUs only; its 0-GPU jobs are never held back
    "draco": Quota(gpus=10, jobs=8, member_gpus=2, share=50),  # member cap: 3 members x 2
    "eridanus": Quota(gpus=4, jobs=8),  # GPUs
}


class Farm(ScriptedExecutor):
    """The scripted engine with a 24-GPU cluster behind it."""

    def capacity(self) -> Capacity:
        return Capacity(True, CAPACITY)


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (run by `make test`)")


@pytest.fixture
def farm(use_executor) -> Farm:
    fake = Farm()
    use_executor(fake)
    return fake


def _populate() -> dict[str, Team]:
    """Five teams of three members, 100 queued jobs each of 0 to `largest_job` GPUs."""
    cluster = Cluster.objects.create(name="farm", kind="noop", settings={"gpus": CAPACITY})
    teams, jobs = {}, []
    for name, quota in QUOTAS.items():
        team = Team.objects.create(
            name=name,
            gpu_quota=quota.gpus,
            max_jobs=quota.jobs,
            user_gpu_cap=quota.member_gpus,
            default_cluster=cluster,
        )
        if quota.share is not None:
            ClusterShare.objects.create(cluster=cluster, team=team, percent=quota.share)
        members = [User.objects.create_user(f"{name}-{n}") for n in range(MEMBERS)]
        Membership.objects.bulk_create(Membership(team=team, user=u) for u in members)
        jobs += [
            Job(
                run_id=f"{name}{n:04d}",
                team=team,
                user=members[n % MEMBERS],
                cluster=cluster,
                total_gpus=n % (quota.largest_job + 1),
                priority=n % 3,
                entrypoint=["train"],
            )
            for n in range(JOBS_PER_TEAM)
        ]
        teams[name] = team
    Job.objects.bulk_create(jobs)
    JobEvent.objects.bulk_create(
        JobEvent(job=job, kind=JobEvent.Kind.STATUS, to_status=S.QUEUED, actor="test")
        for job in Job.objects.all()
    )  # as submit_job writes it
    return teams


Row = tuple[int, int, int, int, int]  # team, user, cluster, GPUs, jobs held


class Limits:
    """Every quota of every team, and the cluster's capacity, against what is held."""

    def __init__(self, teams: dict[str, Team]) -> None:
        self.quota = {team.pk: QUOTAS[name] for name, team in teams.items()}
        self.name = {team.pk: name for name, team in teams.items()}

    def uses(self, held: list[Row]) -> list[tuple[str, int, int]]:
        """(what, used, limit) for every limit something is held against."""
        sums: dict[tuple, int] = defaultdict(int)
        for team, user, cluster, gpus, jobs in held:
            for key, value in (
                (("GPUs", team), gpus),
                (("jobs", team), jobs),
                (("member GPUs", team, user), gpus),
                (("share", team, cluster), gpus),
                (("capacity", cluster), gpus),
            ):
                sums[key] += value
        out = []
        for key, used in sums.items():
            limit = self._limit(*key)
            if limit is not None:
                what = key[0] if key[0] == "capacity" else f"{self.name[key[1]]} {key[0]}"
                out.append((what, used, limit))
        return out

    def _limit(self, what: str, owner: int, *_) -> int | None:
        if what == "capacity":
            return CAPACITY
        quota = self.quota[owner]
        return {
            "GPUs": quota.gpus,
            "jobs": quota.jobs,
            "member GPUs": quota.member_gpus,
            "share": quota.share_gpus,
        }[what]

    def breaches(self, held: list[Row]) -> list[str]:
        return [f"{what}: {n} > {limit}" for what, n, limit in self.uses(held) if n > limit]


def _held_now() -> list[Row]:
    """What every team holds, read in one statement: one snapshot of the ledger."""
    rows = (
        Job.objects.filter(status__in=S.active())
        .values("team_id", "user_id", "cluster_id")
        .annotate(held=Sum("total_gpus"), jobs=Count("id"))
        .values_list("team_id", "user_id", "cluster_id", "held", "jobs")
    )
    return list(rows)


def _replay_timeline(limits: Limits) -> tuple[list[str], int, set[str]]:
    """Walk every status event in commit order, checking the holdings at each admission.

    Events of one job are ordered by its row lock; an end the scheduler saw was written (and
    numbered) before that tick's admissions, so replaying in id order never shows a team
    holding more than the scheduler saw: a breach here is a real one. Also returns which
    limits were ever reached, to show the quotas were really under pressure.
    """
    jobs = {pk: (t, u, c, g) for pk, t, u, c, g in Job.objects.values_list(
        "pk", "team_id", "user_id", "cluster_id", "total_gpus"
    )}  # fmt: skip
    status = dict.fromkeys(jobs, "")
    holding: set[int] = set()
    out, admissions, reached = [], 0, set()
    events = JobEvent.objects.filter(kind=JobEvent.Kind.STATUS).order_by("pk")
    for pk, job, before, after in events.values_list("pk", "job_id", "from_status", "to_status"):
        if before != status[job]:
            out.append(f"event {pk}: job {job} went {before}->{after} but was {status[job]}")
        status[job] = after
        if after in S.active():
            holding.add(job)
        else:
            holding.discard(job)
        if after == S.SUBMITTED:
            admissions += 1
            held = [(*jobs[j], 1) for j in holding]
            out += [f"after event {pk}: {breach}" for breach in limits.breaches(held)]
            uses = limits.uses(held)
            reached |= {what.split(" ", 1)[-1] for what, used, limit in uses if used == limit}
    return out, admissions, reached


def _scheduler(admitted: list[int], skipped: list[int]):
    def step():
        result = admit_queued_jobs()
        launch_attempts(result.admitted)  # as the schedule task's launch chunks do
        admitted.append(len(result.admitted))
        skipped.append(int(result.skipped))
        time.sleep(0.05)

    return step


def _finisher(rng: random.Random):
    """The cluster at work: pending jobs start, running jobs end (one in five failing).

    Batched transitions keep it fast enough to churn 500 jobs through small quotas; the
    reconciler's own path to these states is proven in test_reconciler.py.
    """

    def step():
        active = Job.objects.filter(status__in=[S.PENDING, S.RUNNING])
        start, ok, bad = [], [], []
        for pk, status in active.values_list("pk", "status"):
            if rng.random() < 0.4:
                continue  # still pulling its image, or still training
            if status == S.PENDING:
                start.append(pk)
            else:
                (ok if rng.random() < 0.8 else bad).append(pk)
        now = timezone.now()
        _move(start, S.RUNNING, S.PENDING, start_time=now)
        _move(ok, S.SUCCEEDED, S.RUNNING, end_time=now, exit_code=0)
        _move(bad, S.FAILED, S.RUNNING, end_time=now, exit_code=1, failure="exit")
        time.sleep(0.05)

    return step


def _move(job_ids: list[int], target: JobStatus, expected: JobStatus, **attempt) -> None:
    with transaction.atomic():
        changed, _ = apply_transitions(
            target, [Change(pk, f"test: {target}") for pk in job_ids],
            actor="cluster", expected={expected},
        )  # fmt: skip
        Attempt.objects.filter(job__in=changed, pk=F("job__current_attempt")).update(**attempt)


def test_two_schedulers_never_let_a_team_exceed_any_quota_on_500_jobs(farm):
    limits = Limits(_populate())
    samples: list[list[str]] = []
    errors: list[Exception] = []
    stop = threading.Event()
    admitted: tuple[list[int], list[int]] = ([], [])
    skipped: tuple[list[int], list[int]] = ([], [])

    def sample():
        samples.append(limits.breaches(_held_now()))
        time.sleep(0.02)

    threads = [
        looping(_scheduler(admitted[0], skipped[0]), errors, stop),
        looping(_scheduler(admitted[1], skipped[1]), errors, stop),
        looping(_finisher(random.Random(6)), errors, stop),
        looping(sample, errors, stop),
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    final = [S.SUCCEEDED, S.FAILED]
    while time.monotonic() - started < DEADLINE_S and not stop.is_set():
        if not Job.objects.exclude(status__in=final).exists():
            break
        time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []

    assert Job.objects.exclude(status__in=final).count() == 0, "not every job ended in time"
    assert Attempt.objects.count() == 5 * JOBS_PER_TEAM  # each job admitted exactly once
    assert sum(admitted[0]) > 0 and sum(admitted[1]) > 0  # both schedulers admitted jobs
    assert sum(skipped[0]) > 0 and sum(skipped[1]) > 0  # and each found the other mid-tick
    assert len(samples) > 100
    assert [b for sample in samples for b in sample] == []
    breaches, admissions, reached = _replay_timeline(limits)
    assert breaches == []
    assert admissions == 5 * JOBS_PER_TEAM
    # Every kind of limit was reached at some admission: the quotas were really tested.
    assert reached == {"GPUs", "jobs", "member GPUs", "share", "capacity"}
    assert ledgercheck.violations() == []
