"""Scheduler benchmarks: admission throughput, and the cost of one tick against queue depth.

Both run the real code path in-process against this child's own PostgreSQL database:
`jobs.loops.scheduler.admit_queued_jobs()`, then `jobs.loops.launcher.launch_attempts()` in
chunks of `jobs.tasks.LAUNCH_CHUNK` (what the Celery `schedule_tick` / `launch` tasks do, minus
the broker).
"""

from __future__ import annotations

import time

from bench import common

N_TEAMS = 100


GANG_NODES = 2  # each multi-node job of `sched-gang`: 2 nodes x 1 GPU
CLUSTER_NODES = 200  # nodes of the cluster in `sched-gang`, each with an equal share of GPUs


def throughput(n_jobs: int, quota: int, gang_every: int = 0) -> dict:
    """`n_jobs` QUEUED over 100 teams of `quota` GPUs each; tick until nothing more is admitted.

    With `gang_every` N, every Nth job is a 2-node gang and the cluster reports
    CLUSTER_NODES nodes, so every admission goes through per-node placement (gang admission).
    The clock runs from the first tick until the last admitted job is PENDING (the final tick
    that finds nothing more to admit is reported apart, as `idle_tick_s`).
    """
    from django.db.models import Count, Q

    from jobs.loops.launcher import launch_attempts
    from jobs.loops.scheduler import admit_queued_jobs
    from jobs.models import Job
    from jobs.tasks import LAUNCH_CHUNK

    user = common.make_user()
    cluster = common.make_cluster(gpus=n_jobs * 2, nodes=CLUSTER_NODES if gang_every else 0)
    teams = common.make_teams(N_TEAMS, quota, cluster, user)  # a member: admission stops outsiders
    t = time.perf_counter()
    common.queue_jobs(n_jobs, teams, cluster, user)
    if gang_every:
        # Jobs go round-robin over the teams: every team gets one gang in each `gang_every`
        # rounds, so each team's share is 10% too.
        ids = Job.objects.order_by("id").values_list("id", flat=True)
        gangs = [i for k, i in enumerate(ids) if (k // N_TEAMS) % gang_every == 0]
        Job.objects.filter(id__in=gangs).update(nodes=GANG_NODES, total_gpus=GANG_NODES)
    common.analyze()
    setup_s = time.perf_counter() - t

    ticks, admitted, admit_s, launch_s, launched = [], 0, 0.0, 0.0, 0
    start = time.perf_counter()
    done_at = start
    while True:
        t0 = time.perf_counter()
        result = admit_queued_jobs()
        t1 = time.perf_counter()
        if result.skipped:
            raise RuntimeError("the scheduler lock was taken: is another scheduler running?")
        for i in range(0, len(result.admitted), LAUNCH_CHUNK):
            outcomes = launch_attempts(result.admitted[i : i + LAUNCH_CHUNK])
            launched += sum(1 for o in outcomes if o.job_ref)
        t2 = time.perf_counter()
        ticks.append({"admitted": len(result.admitted), "admit_s": t1 - t0, "launch_s": t2 - t1})
        if not result.admitted:
            break
        admitted += len(result.admitted)
        admit_s += t1 - t0
        launch_s += t2 - t1
        done_at = t2
        if not Job.objects.filter(status="QUEUED").exists():
            break
    elapsed = done_at - start

    counts = dict(Job.objects.values_list("status").annotate(n=Count("id")))
    over = (
        Job.objects.filter(status__in=["SUBMITTED", "PENDING", "RUNNING"])
        .values("team")
        .annotate(n=Count("id"))
        .filter(~Q(n__lte=quota))
        .count()
    )
    if counts.get("PENDING", 0) != admitted or launched != admitted or over:
        raise RuntimeError(f"inconsistent end state: {counts}, launched {launched}, over {over}")
    return {
        "jobs": n_jobs,
        "multi_node_jobs": Job.objects.filter(nodes__gt=1).count(),
        "cluster_nodes": CLUSTER_NODES if gang_every else None,
        "teams": N_TEAMS,
        "team_quota_gpus": quota,
        "admitted": admitted,
        "left_queued": counts.get("QUEUED", 0),
        "ticks_with_admissions": sum(1 for x in ticks if x["admitted"]),
        "seconds": round(elapsed, 3),
        "jobs_per_s": round(admitted / elapsed, 1) if elapsed else None,
        "admit_s": round(admit_s, 3),
        "launch_s": round(launch_s, 3),
        "idle_tick_s": round(ticks[-1]["admit_s"], 3) if not ticks[-1]["admitted"] else None,
        "setup_s": round(setup_s, 2),
    }


def one_tick(depth: int, quota: int = 1) -> dict:
    """One tick over `depth` QUEUED jobs where only `quota` per team fit, then a second one.

    The first tick admits N_TEAMS * quota jobs and writes a waiting reason on every other row;
    the second (steady state) finds the same reasons and admits nothing.
    """
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.loops.scheduler import admit_queued_jobs

    user = common.make_user()
    cluster = common.make_cluster(gpus=depth * 2)
    teams = common.make_teams(N_TEAMS, quota, cluster, user)  # a member: admission stops outsiders
    t = time.perf_counter()
    common.queue_jobs(depth, teams, cluster, user)
    common.analyze()
    setup_s = time.perf_counter() - t

    out = {"queued": depth, "teams": N_TEAMS, "team_quota_gpus": quota}
    out["setup_s"] = round(setup_s, 2)
    for label in ("first", "steady"):
        with CaptureQueriesContext(connection) as ctx:
            t0 = time.perf_counter()
            result = admit_queued_jobs()
            wall = time.perf_counter() - t0
        sql_times = [float(q["time"]) for q in ctx.captured_queries]
        slowest = max(ctx.captured_queries, key=lambda q: float(q["time"]))
        out[label] = {
            "queries": len(ctx.captured_queries),
            "wall_s": round(wall, 3),
            "sql_s": round(sum(sql_times), 3),
            "slowest_sql_s": round(float(slowest["time"]), 3),
            "slowest_sql": slowest["sql"][:120],
            "admitted": len(result.admitted),
            "waiting_reasons_written": result.waiting,
        }
    return out


SMALL_LIMIT_S = 600  # every 1-GPU job's time limit in `sched-starvation`
TICK_S = 10  # simulated seconds between ticks
ARRIVALS_PER_TICK = 2  # 1-GPU jobs submitted each tick: far more than 8 GPUs can run


STREAMS = 5  # seeded streams per run of `sched-starvation`; the figure is the longest wait


def starvation() -> dict:
    """`_starvation_stream` for STREAMS seeds, each on a fresh cluster and team: the longest
    wait, and every stream's."""
    streams = [_starvation_stream(seed, f"s{seed}") for seed in range(1, STREAMS + 1)]
    started = all(s["big_started"] for s in streams)
    return {
        **{k: streams[0][k] for k in ("small_time_limit_s", "tick_s", "arrivals_per_tick")},
        "streams": streams,
        "big_started": started,
        "big_waited_s": max(s["big_waited_s"] for s in streams) if started else None,
        "small_jobs_started_while_it_waited": max(
            s["small_jobs_started_while_it_waited"] for s in streams
        ),
        "ticks": max(s["ticks"] for s in streams),
    }


def _starvation_stream(seed: int, name: str) -> dict:
    """An 8-GPU job waits on a cluster of 8 GPUs kept busy by a steady stream of 1-GPU jobs
    (time limit SMALL_LIMIT_S, each running a random 20 to 100 % of it), on a simulated clock:
    each tick ends the 1-GPU jobs whose run is over (a stop, as the reconciler's), submits
    ARRIVALS_PER_TICK more, and runs the real scheduler tick at that time. The big job is
    submitted at the head of the order (a higher priority) once the cluster is full; the
    figure is how long it waited. Aim: no longer than the 1-GPU jobs' time limit."""
    import datetime as dt
    import random

    from django.utils import timezone

    from jobs.ledger.halt import halt
    from jobs.loops.scheduler import admit_queued_jobs
    from jobs.models import Attempt, Job, Membership, Team
    from jobs.states import JobStatus as S

    rng = random.Random(seed)
    user = common.make_user(f"bench-{name}")
    cluster = common.make_cluster(gpus=8, name=f"bench-{name}")
    team = Team.objects.create(name=f"bench-{name}", gpu_quota=1000, default_cluster=cluster)
    Membership.objects.create(team=team, user=user, role="member")
    now = timezone.now()
    ends: dict[int, dt.datetime] = {}  # running small job -> when its run is over
    submitted = 0

    def submit(total_gpus: int, limit: int, priority: int = 0) -> Job:
        nonlocal submitted
        submitted += 1
        return Job.objects.create(
            run_id=f"{name}-{submitted:07d}", team=team, user=user, cluster=cluster,
            total_gpus=total_gpus, entrypoint=["true"], priority=priority, time_limit_s=limit,
            submitted_at=now, status_changed_at=now,
        )  # fmt: skip

    def tick() -> list[int]:
        over = [job for job, end in ends.items() if end <= now]
        if over:
            halt(over, S.STOPPED, "bench: its run is over", actor="bench", now=now)
            for job in over:
                del ends[job]
        for _ in range(ARRIVALS_PER_TICK):
            submit(1, SMALL_LIMIT_S)
        admitted = admit_queued_jobs(now=now).admitted
        jobs = list(Attempt.objects.filter(pk__in=admitted).values_list("job_id", flat=True))
        return jobs

    warm_up = 0
    while len(ends) < 8 or warm_up < 3:  # the cluster full of 1-GPU jobs, a queue behind
        for job in tick():
            ends[job] = now + dt.timedelta(seconds=SMALL_LIMIT_S * rng.uniform(0.2, 1.0))
        now += dt.timedelta(seconds=TICK_S)
        warm_up += 1
    big = submit(8, 3600, priority=10)
    at_head, small_passed, ticks = now, 0, 0
    t0 = time.perf_counter()
    while ticks < 10 * SMALL_LIMIT_S // TICK_S:
        ticks += 1
        admitted = tick()
        if big.pk in admitted:
            break
        small_passed += len(admitted)
        for job in admitted:
            ends[job] = now + dt.timedelta(seconds=SMALL_LIMIT_S * rng.uniform(0.2, 1.0))
        now += dt.timedelta(seconds=TICK_S)
    started = Job.objects.get(pk=big.pk).status != S.QUEUED
    # This stream's jobs end here, so the next stream's cluster is alone.
    left = list(
        Job.objects.filter(team=team, status__in=(S.QUEUED, *S.active())).values_list(
            "pk", flat=True
        )
    )
    halt(left, S.STOPPED, "bench: the stream is over", actor="bench", now=now)
    return {
        "seed": seed,
        "cluster_gpus": 8,
        "small_time_limit_s": SMALL_LIMIT_S,
        "tick_s": TICK_S,
        "arrivals_per_tick": ARRIVALS_PER_TICK,
        "big_started": started,
        "big_waited_s": (now - at_head).total_seconds() if started else None,
        "small_jobs_started_while_it_waited": small_passed,
        "ticks": ticks,
        "wall_s": round(time.perf_counter() - t0, 2),
    }


ARRAY_TASKS = 10_000
ARRAY_CAP = 500  # --max-parallel of the capped run


def array_10k() -> dict:
    """A 10,000-task array submitted in one request (POST /api/v1/arrays through Django's
    request path, with a user's token), then admitted: ticks (and launches on the noop
    engine) until every task is PENDING; and the same array with --max-parallel 500, where
    a tick over 10,000 queued tasks admits 500 and then, steady, none."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from jobs.actions.tokens import issue_token
    from jobs.loops.launcher import launch_attempts
    from jobs.loops.scheduler import admit_queued_jobs
    from jobs.models import Job
    from jobs.tasks import LAUNCH_CHUNK

    user = common.make_user()
    cluster = common.make_cluster(gpus=ARRAY_TASKS * 2)
    (team,) = common.make_teams(1, ARRAY_TASKS * 2, cluster, user)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {issue_token(user)}")
    out: dict = {"tasks": ARRAY_TASKS}

    def submit(**extra) -> tuple[float, int]:
        body = {
            "entrypoint": ["python", "train.py", "--seed", "{index}"],
            "array": f"0-{ARRAY_TASKS - 1}",
            "team": team.name,
            **extra,
        }
        with CaptureQueriesContext(connection) as seen:
            t0 = time.perf_counter()
            answer = client.post("/api/v1/arrays", body, content_type="application/json")
            took = time.perf_counter() - t0
        if answer.status_code != 201:
            raise RuntimeError(f"submit answered {answer.status_code}: {answer.content[:300]}")
        return took, len(seen.captured_queries)

    took, queries = submit()
    out["submit_s"], out["submit_queries"] = round(took, 3), queries
    common.analyze()
    start, ticks = time.perf_counter(), 0
    while Job.objects.filter(status="QUEUED").exists():
        result = admit_queued_jobs()
        ticks += 1
        for i in range(0, len(result.admitted), LAUNCH_CHUNK):
            launch_attempts(result.admitted[i : i + LAUNCH_CHUNK])
        if not result.admitted:
            raise RuntimeError("a tick admitted nothing with tasks still queued")
    elapsed = time.perf_counter() - start
    out["admit_all_s"], out["ticks"] = round(elapsed, 3), ticks
    out["admitted_per_s"] = round(ARRAY_TASKS / elapsed, 1)

    # The first array's tasks still hold 10,000 of the team's and the cluster's 20,000 GPUs.
    took, queries = submit(max_parallel=ARRAY_CAP)
    out["capped"] = {"max_parallel": ARRAY_CAP, "submit_s": round(took, 3)}
    for label in ("first", "steady"):
        with CaptureQueriesContext(connection) as seen:
            t0 = time.perf_counter()
            result = admit_queued_jobs()
            wall = time.perf_counter() - t0
        out["capped"][label] = {
            "wall_s": round(wall, 3),
            "queries": len(seen.captured_queries),
            "admitted": len(result.admitted),
        }
    if out["capped"]["first"]["admitted"] != ARRAY_CAP or out["capped"]["steady"]["admitted"]:
        raise RuntimeError(f"--max-parallel not kept: {out['capped']}")
    return out
