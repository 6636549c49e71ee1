"""`check_ledger`: verify the ledger keeps the invariants of docs/ARCHITECTURE.md, a line each.

Reads the whole ledger in a few streaming queries; safe to run on a live system (it reports an
attempt just launched or a job just moved only if the ledger is really inconsistent). For
the backend side of invariant 4 it lists what each cluster's engine holds for Starforge: an
object pending or running that no open attempt accounts for is an orphan.
"""

import datetime as dt
import itertools
from collections import defaultdict
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from jobs.executors import executor_for
from jobs.models import Attempt, Cluster, Job, JobEvent, Team
from jobs.states import JobStatus, is_allowed

S = JobStatus


def violations(now: dt.datetime | None = None) -> list[str]:
    now = now or timezone.now()
    found: list[str] = []
    checks = (timelines, quotas_now, admissions, attempts, orphans, follow_ons, metering)
    for check in checks:
        found.extend(check(now))
    return found


def timelines(now: dt.datetime) -> Iterator[str]:
    """Every status is reached by allowed transitions, and the row agrees with its last event."""
    status = dict(Job.objects.values_list("pk", "status"))
    events = (
        JobEvent.objects.filter(kind=JobEvent.Kind.STATUS)
        .order_by("job_id", "id")
        .values_list("job_id", "from_status", "to_status")
    )
    last: dict[int, str] = {}
    for job_id, src, dst in events.iterator(chunk_size=10_000):
        before = last.get(job_id)
        if before is None:
            if src or dst != S.QUEUED:
                yield f"job {job_id}: its timeline starts with {src or '∅'}→{dst}, not ∅→QUEUED"
        elif src != before:
            yield f"job {job_id}: an event goes {src}→{dst} but the job was {before}"
        elif not is_allowed(src, dst):
            yield f"job {job_id}: {src}→{dst} is not an allowed transition"
        last[job_id] = dst
    for job_id, current in status.items():
        if job_id not in last:
            yield f"job {job_id}: {current} with no status events"
        elif last[job_id] != current:
            yield f"job {job_id}: the row says {current} but its last event says {last[job_id]}"


def quotas_now(now: dt.datetime) -> Iterator[str]:
    """No team holds more GPUs, slots or member GPUs than its quotas allow, now. GPUs held on
    a lender's idle quota count against the lender's quota, and against the borrower's cap."""
    teams = {t.pk: t for t in Team.objects.all()}
    active = Job.objects.filter(status__in=S.active())
    on_quota: dict[int, int] = defaultdict(int)
    borrowed: dict[int, int] = defaultdict(int)
    jobs: dict[int, int] = defaultdict(int)
    rows = active.values("team_id", "current_attempt__borrowed_from").annotate(
        held=Sum("total_gpus"), jobs=Count("id")
    )
    for row in rows:
        lender = row["current_attempt__borrowed_from"]
        on_quota[lender or row["team_id"]] += row["held"] or 0
        if lender is not None:
            borrowed[row["team_id"]] += row["held"] or 0
        jobs[row["team_id"]] += row["jobs"]
    for pk, gpus in on_quota.items():
        team = teams[pk]
        if gpus > team.gpu_quota:
            yield f"team {team.name}: holds {gpus} GPUs, quota {team.gpu_quota}"
    for pk, gpus in borrowed.items():
        team = teams[pk]
        if gpus > (team.borrow_cap or 0):
            yield f"team {team.name}: borrows {gpus} GPUs, cap {team.borrow_cap or 0}"
    for pk, count in jobs.items():
        team = teams[pk]
        if team.max_jobs is not None and count > team.max_jobs:
            yield f"team {team.name}: runs {count} jobs, slots {team.max_jobs}"
    by_member = active.values("team_id", "user__username").annotate(held=Sum("total_gpus"))
    for member in by_member:
        team = teams[member["team_id"]]
        if team.user_gpu_cap is not None and member["held"] > team.user_gpu_cap:
            yield (
                f"team {team.name}: {member['user__username']} holds {member['held']} GPUs, "
                f"per-member cap {team.user_gpu_cap}"
            )


def admissions(now: dt.datetime) -> Iterator[str]:
    """Replay every status event in order: at each admission the team held no more than the
    quotas recorded in that admission event, and a lender no more than its quota (as recorded
    by events written before lenders went unnamed, else its quota now)."""
    total_gpus = dict(Job.objects.values_list("pk", "total_gpus"))
    owner = {pk: (team, user) for pk, team, user in Job.objects.values_list("pk", "team", "user")}
    quota_now = dict(Team.objects.values_list("pk", "gpu_quota"))
    team_gpus: dict[int, int] = defaultdict(int)  # on each team's quota (lent GPUs included)
    team_jobs: dict[int, int] = defaultdict(int)
    member_gpus: dict[tuple[int, int], int] = defaultdict(int)
    borrowed: dict[int, int] = defaultdict(int)
    admitted_times: dict[int, int] = defaultdict(int)
    lender: dict[int, int] = {}  # job -> the team whose quota its current admission is on
    holding = S.active()
    events = JobEvent.objects.filter(kind=JobEvent.Kind.STATUS).order_by("id")
    rows = events.values_list("job_id", "from_status", "to_status", "data")
    replay = rows.iterator(chunk_size=10_000)
    first = next(replay, None)
    # Read once the events' cursor is open: each admission it holds committed with its attempt,
    # so that attempt is read too, however many the scheduler admits meanwhile.
    lenders = _lenders()
    for job_id, src, dst, data in itertools.chain([first] if first else [], replay):
        team, user = owner[job_id]
        admitted = dst == S.SUBMITTED and src == S.QUEUED
        if admitted:
            admitted_times[job_id] += 1
            lender.pop(job_id, None)
            if (job_id, admitted_times[job_id]) in lenders:
                lender[job_id] = lenders[(job_id, admitted_times[job_id])]
        sign = (dst in holding) - (src in holding)
        on = lender.get(job_id, team)
        team_gpus[on] += sign * total_gpus[job_id]
        if on != team:
            borrowed[team] += sign * total_gpus[job_id]
        team_jobs[team] += sign
        member_gpus[(team, user)] += sign * total_gpus[job_id]
        if not admitted or not data:
            continue
        limits = [
            ("GPUs", team_gpus[team], data.get("gpu_quota")),
            ("jobs", team_jobs[team], data.get("max_jobs")),
            ("member GPUs", member_gpus[(team, user)], data.get("user_gpu_cap")),
        ]
        if on != team:
            limits += [
                ("GPUs of its lender", team_gpus[on], data.get("lender_quota", quota_now[on])),
                ("borrowed GPUs", borrowed[team], data.get("borrow_cap")),
            ]
        for what, held, limit in limits:
            if limit is not None and held > limit:
                yield f"job {job_id}: admitted while its team held {held} {what}, limit {limit}"


def _lenders() -> dict[tuple[int, int], int]:
    """(job, attempt number) -> the team that lent the attempt its GPUs. The borrower's events
    do not say (another team's figures); its k-th admission opened its attempt k, since the
    scheduler's admission is the one place an attempt is opened (jobs.ledger.clocks)."""
    on_loan = Attempt.objects.filter(borrowed_from__isnull=False)
    rows = on_loan.values_list("job_id", "number", "borrowed_from_id")
    return {(job, number): team for job, number, team in rows}


def attempts(now: dt.datetime) -> Iterator[str]:
    """One open attempt per active job, none for others; each launched within the grace."""
    grace = dt.timedelta(seconds=settings.SF_LOST_GRACE_S)
    open_attempts = Attempt.objects.filter(end_time__isnull=True)
    per_job = open_attempts.values("job_id").annotate(n=Count("id")).filter(n__gt=1)
    for row in per_job:
        yield f"job {row['job_id']}: {row['n']} open attempts"
    for job_id, status in open_attempts.exclude(job__status__in=S.active()).values_list(
        "job_id", "job__status"
    ):
        yield f"job {job_id}: {status} but an attempt is still open"
    lacking = (
        Job.objects.filter(status__in=S.active())
        .filter(Q(current_attempt__isnull=True) | Q(current_attempt__end_time__isnull=False))
        .values_list("pk", "status")
    )
    for job_id, status in lacking:
        yield f"job {job_id}: {status} without an open current attempt"
    unlaunched = open_attempts.filter(job_ref="", submitted_at__lt=now - grace)
    for job_id, name in unlaunched.values_list("job_id", "backend_name"):
        yield f"job {job_id}: attempt {name} has no backend object after {grace.seconds} s"
    early = Attempt.objects.filter(start_time__lt=F("submitted_at"))
    for job_id, name in early.values_list("job_id", "backend_name"):
        yield f"job {job_id}: attempt {name} is billed from before it was admitted"


UNRECORDED_LOOKBACK = dt.timedelta(days=1)


def orphans(now: dt.datetime) -> Iterator[str]:
    """No backend object pending or running that no open attempt accounts for.

    Each engine lists what it holds for Starforge (`Executor.starforge_objects`, which only
    looks); each object must belong to an attempt still open, or to one closed less than the
    grace period ago (the reconciler cancels those again). An object behind an attempt closed
    longer ago, or recorded by no attempt at all (a launch whose attempt row was lost), is an
    orphan.
    """
    grace = dt.timedelta(seconds=settings.SF_LOST_GRACE_S)
    for cluster in Cluster.objects.filter(enabled=True).exclude(kind=Cluster.Kind.NOOP):
        try:
            executor = executor_for(cluster)
            held = executor.starforge_objects()
            owners = _owners(executor, cluster, held, now)
        except Exception as exc:  # cannot verify: say so rather than pass
            yield f"cluster {cluster.name}: its backend objects could not be checked ({exc})"
            continue
        for ref, obs in sorted(held.items()):
            mine = [a for a in owners.get(ref, []) if obs.name in ("", a.backend_name)]
            if any(a.end_time is None or a.end_time >= now - grace for a in mine):
                continue
            if not mine:
                named = f" ({obs.name})" if obs.name not in ("", ref) else ""
                yield (
                    f"cluster {cluster.name}: backend object {ref}{named} is "
                    f"{obs.native_state} but no attempt in the ledger launched it"
                )
                continue
            attempt = max(mine, key=lambda a: a.end_time or now)
            yield (
                f"job {attempt.job_id}: attempt {attempt.backend_name} ended at "
                f"{attempt.end_time:%Y-%m-%d %H:%M:%S} but its backend object {ref} on "
                f"cluster {cluster.name} is still {obs.native_state}"
            )


def _owners(executor, cluster: Cluster, held: dict, now: dt.datetime) -> dict[str, list[Attempt]]:
    """{ref: the attempts that recorded it}, of the objects the engine `held`, and for attempts of
    the last day that never recorded their ref (closed or crashed mid-launch) the object the
    engine finds by name."""
    owners: dict[str, list[Attempt]] = defaultdict(list)
    if not held:
        return owners
    for attempt in Attempt.objects.filter(job__cluster=cluster, job_ref__in=list(held)):
        owners[attempt.job_ref].append(attempt)
    if len(owners) < len(held):
        unrecorded = Attempt.objects.filter(job__cluster=cluster, job_ref="").filter(
            Q(end_time__isnull=True) | Q(end_time__gte=now - UNRECORDED_LOOKBACK)
        )
        for attempt in unrecorded:
            ref = executor.find(attempt.backend_name)
            if ref in held:
                owners[ref].append(attempt)
    return owners


def follow_ons(now: dt.datetime) -> Iterator[str]:
    """Follow-on jobs exist once per name, only for a parent that succeeded, and every name a
    succeeded parent asked for was created (a child deleted since then is not missing)."""
    children: dict[int, list[str]] = defaultdict(list)
    for parent, name in Job.objects.filter(parent__isnull=False).values_list(
        "parent_id", "follow_on_name"
    ):
        children[parent].append(name)
    created: dict[int, set[str]] = defaultdict(set)
    notes = JobEvent.objects.filter(kind=JobEvent.Kind.NOTE, reason__startswith="follow-on ")
    for pk, reason in notes.filter(reason__contains=" created as job ").values_list(
        "job_id", "reason"
    ):
        created[pk].add(reason.split()[1])
    parents = Job.objects.filter(Q(pk__in=list(children)) | Q(status=S.SUCCEEDED))
    for pk, status, then in parents.values_list("pk", "status", "then").iterator():
        made = children.get(pk, [])
        if status != S.SUCCEEDED and made:
            yield f"job {pk}: {status} but follow-ons {', '.join(sorted(made))} exist"
            continue
        for name in sorted(set(made)):
            if made.count(name) > 1:
                yield f"job {pk}: follow-on {name} exists {made.count(name)} times"
        for name in then or []:
            if status == S.SUCCEEDED and name not in made and name not in created[pk]:
                yield f"job {pk}: succeeded but its follow-on {name} was never created"


def metering(now: dt.datetime) -> Iterator[str]:
    from metering.consistency import usage_violations

    yield from usage_violations(now)
