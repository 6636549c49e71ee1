"""Slurm benchmarks on the real single-node Slurm of `.ci/slurm.sh` (started when it is not
running, and stopped afterwards only then).

`vs_sbatch`: the same short jobs (the job-side runner running `python -c pass`, offline: no API
server) submitted through Starforge's real path and straight with sbatch, side by side.
Starforge: `submit_job` in a process of its own (as the API server would), a worker
thread running `launch_attempts()` on the chunks the ticks hand it (the Celery `launch` task),
and the main thread running beat's ticks: `admit_queued_jobs()`, `reconcile_all()`, then a
LOOP_SLEEP_S sleep. sbatch: a submitting thread runs sbatch, the main
thread runs one squeue per loop with the same sleep. A job is RUNNING / done when the loop first
sees it so (the ledger's JobEvent times, the squeue poll's clock). Production beat ticks every
2 s, which adds up to 2 s to what the ledger shows; both sides here see the same cadence.

`reconcile_1000`: one reconciler tick over 1,000 PENDING Slurm jobs (held with `sbatch --hold`,
no GPUs): Slurm commands run, wall time and SQL statements, first tick and steady state.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from bench import common

SCRIPT = common.ROOT / ".ci" / "slurm.sh"
STATE_DIR = Path(os.environ.get("SF_SLURM_DIR", "/tmp/starforge-slurm"))
LOOP_SLEEP_S = 0.25
ACTIVE = {"CONFIGURING", "RUNNING", "COMPLETING"}
TIMEOUT_S = 300


@contextlib.contextmanager
def slurm_up():
    """The path of a running test Slurm's slurm.conf; stops it afterwards if this started it."""
    if shutil.which("sbatch") is None:
        raise SystemExit("Slurm is not installed: run `.ci/slurm.sh install`, then the bench")
    already_up = subprocess.run([SCRIPT, "status"], capture_output=True).returncode == 0
    if not already_up:
        subprocess.run([SCRIPT, "up"], check=True, capture_output=True, timeout=120)
    try:
        yield str(STATE_DIR / "etc" / "slurm.conf")
    finally:
        if not already_up:
            subprocess.run([SCRIPT, "down"], capture_output=True, timeout=60)


def slurm(*args: str, conf: str) -> str:
    env = {**os.environ, "SLURM_CONF": conf}
    return subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout


def scancel(ids: list[str], conf: str) -> None:
    for start in range(0, len(ids), 500):
        subprocess.run(
            ["scancel", *ids[start : start + 500]],
            env={**os.environ, "SLURM_CONF": conf},
            capture_output=True,
        )


def _setup(conf: str, name: str):
    from django.conf import settings

    from jobs.models import Cluster, Membership

    settings.SF_API_URL = ""  # offline runners: this compares orchestration, not log shipping
    work_dir = Path(os.environ["SF_VAR_DIR"]) / "slurm" / name
    cluster = Cluster.objects.create(
        name=name, kind="slurm", settings={"slurm_conf": conf, "work_dir": str(work_dir)}
    )
    user = common.make_user()
    [team] = common.make_teams(1, quota=10_000, cluster=cluster)
    Membership.objects.create(team=team, user=user, role="member")
    return cluster, team, user


# --- Starforge vs sbatch --------------------------------------------------------------------


def vs_sbatch(n: int = 200, gpus: int = 0) -> dict:
    with slurm_up() as conf:
        cluster, team, user = _setup(conf, "slurm-bench")
        direct = _through_sbatch(n, gpus, conf, Path(os.environ["SF_VAR_DIR"]) / "sbatch")
        ours = _through_starforge(n, gpus, cluster, team, user)
    ratio = {
        key: round(ours[key] / direct[key], 2) if direct[key] else None
        for key in ("makespan_s", "running_median_s", "done_median_s")
    }
    return {
        "jobs": n,
        "gpus_per_job": gpus,
        "loop_sleep_s": LOOP_SLEEP_S,
        "sbatch": direct,
        "starforge": ours,
        "ratio": ratio,
    }


def _through_sbatch(n: int, gpus: int, conf: str, work: Path) -> dict:
    tag = uuid.uuid4().hex[:8]
    python = sys.executable
    env = {
        "PATH": f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/"),
        "SLURM_CONF": conf,
        "SF_API_URL": "",
        "SF_SNAPSHOT": "",
        "SF_ENTRYPOINT": json.dumps(["python", "-c", "pass"]),
    }
    gres = [f"--gres=gpu:{gpus}"] if gpus else []
    submitted: dict[str, float] = {}

    def submit_all() -> None:
        for i in range(n):
            run_dir = work / f"bl-{tag}-{i}"
            run_dir.mkdir(parents=True)
            files = {
                f"SF_{k}_FILE": str(run_dir / f"{k.lower()}.json") for k in ("EXIT", "STARTED")
            }
            t = time.time()
            out = subprocess.run(
                ["sbatch", "--parsable", f"--job-name=bl-{tag}-{i}", f"--chdir={run_dir}"]
                + [f"--output={run_dir}/slurm.out", *gres, f"--wrap=exec {python} -m sf.runner"],
                env={**env, **files, "SF_RUN_DIR": str(run_dir / "work")},
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            submitted[out.strip().split(";")[0]] = t

    try:
        running, done = _poll_squeue(n, submitted, submit_all, conf)
    finally:
        scancel(list(submitted), conf)  # only jobs a failed run left behind are still there
    return _figures(submitted, running, done)


def _poll_squeue(n, submitted, submit_all, conf):
    thread = threading.Thread(target=submit_all)
    thread.start()
    running: dict[str, float] = {}
    done: dict[str, float] = {}
    deadline = time.monotonic() + TIMEOUT_S
    while len(done) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"sbatch run: {len(done)} of {n} jobs done in {TIMEOUT_S} s")
        ids = list(submitted)
        if ids:
            out = slurm("squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i %T", conf=conf)
            now = time.time()
            for line in out.splitlines():
                job_id, state = line.split()
                if state in ACTIVE or state == "COMPLETED":
                    running.setdefault(job_id, now)
                if state == "COMPLETED":
                    done.setdefault(job_id, now)
                elif state not in ACTIVE and state != "PENDING":
                    raise RuntimeError(f"sbatch job {job_id} ended {state}")
        time.sleep(LOOP_SLEEP_S)
    thread.join()
    return running, done


def _through_starforge(n: int, gpus: int, cluster, team, user) -> dict:
    from django.db import connection

    from jobs.loops.launcher import launch_attempts
    from jobs.loops.reconciler import reconcile_all
    from jobs.loops.scheduler import admit_queued_jobs
    from jobs.models import Attempt, Job, JobEvent
    from jobs.tasks import LAUNCH_CHUNK

    launches: queue.Queue[list[int] | None] = queue.Queue()

    launch_s: list[float] = []

    def worker() -> None:  # the Celery worker's `launch` tasks
        try:
            while (chunk := launches.get()) is not None:
                t = time.perf_counter()
                launch_attempts(chunk)
                launch_s.append(time.perf_counter() - t)
        finally:
            connection.close()

    api = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from bench import slurm_bench; slurm_bench.submit_jobs({n}, {gpus})",
        ],
        cwd=common.ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    launcher = threading.Thread(target=worker)
    launcher.start()
    deadline = time.monotonic() + TIMEOUT_S
    ticks: list[tuple[float, float]] = []  # (schedule tick, reconcile tick) seconds
    try:
        while api.poll() is None or Job.objects.exclude(status="SUCCEEDED").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Starforge run: not done in {TIMEOUT_S} s")
            if Job.objects.filter(status="FAILED").exists():
                raise RuntimeError(f"Starforge job failed: {_first_failure()}")
            t = time.perf_counter()
            admitted = admit_queued_jobs().admitted  # beat's schedule tick...
            for start in range(0, len(admitted), LAUNCH_CHUNK):
                launches.put(admitted[start : start + LAUNCH_CHUNK])
            t2 = time.perf_counter()
            reconcile_all()  # ...and its reconcile tick
            ticks.append((t2 - t, time.perf_counter() - t2))
            time.sleep(LOOP_SLEEP_S)
    finally:
        launches.put(None)
        launcher.join()
        refs = Attempt.objects.exclude(job_ref="").values_list("job_ref", flat=True)
        scancel(list(refs), cluster.settings["slurm_conf"])
    stdout, _ = api.communicate()
    submitted = {int(k): v for k, v in json.loads(stdout).items()}
    events = JobEvent.objects.filter(to_status__in=["RUNNING", "SUCCEEDED"])
    running, done = {}, {}
    for job_id, to_status, at in events.values_list("job_id", "to_status", "time"):
        (running if to_status == "RUNNING" else done)[job_id] = at.timestamp()
    return {
        **_figures(submitted, running, done),
        "loop_iterations": len(ticks),
        "schedule_tick_max_s": round(max(a for a, _ in ticks), 2),
        "reconcile_tick_median_s": round(statistics.median(b for _, b in ticks), 2),
        "reconcile_tick_max_s": round(max(b for _, b in ticks), 2),
        "launch_chunks": len(launch_s),
        "launch_s": round(sum(launch_s), 2),  # what the worker spent in launch_attempts
    }


def submit_jobs(n: int, gpus: int) -> None:
    """The API server's share, in a process of its own: `n` submits; prints {job id: time}."""
    import django

    django.setup()
    from django.contrib.auth.models import User

    from jobs import kick
    from jobs.actions.submit import submit_job
    from jobs.schemas import JobIn

    kick.scheduler = lambda: None  # no broker here: the bench's loop is the tick
    user = User.objects.get(username="bench")
    spec = JobIn(entrypoint=["python", "-c", "pass"], gpus=gpus)
    submitted = {}
    for _ in range(n):
        t = time.time()
        submitted[submit_job(user, spec).pk] = t
    print(json.dumps(submitted))


def _first_failure() -> str:
    from jobs.models import Job

    return Job.objects.filter(status="FAILED").values_list("status_reason", flat=True)[0]


def _figures(submitted: dict, running: dict, done: dict) -> dict:
    to_running = [running[k] - submitted[k] for k in submitted]
    to_done = [done[k] - submitted[k] for k in submitted]
    return {
        "running_median_s": round(statistics.median(to_running), 2),
        "running_p95_s": round(common.percentile(to_running, 95), 2),
        "done_median_s": round(statistics.median(to_done), 2),
        "done_p95_s": round(common.percentile(to_done, 95), 2),
        "makespan_s": round(max(done.values()) - min(submitted.values()), 2),
        "submit_s": round(max(submitted.values()) - min(submitted.values()), 2),
    }


# --- the reconciler with 1,000 active jobs --------------------------------------------------


def reconcile_1000(n: int = 1000) -> dict:
    with slurm_up() as conf:
        cluster, team, user = _setup(conf, "slurm-held")
        t = time.perf_counter()
        refs = _held_jobs(n, cluster, team, user, conf)
        setup_s = time.perf_counter() - t
        try:
            out = {"jobs": n, "setup_s": round(setup_s, 1)}
            out["first"] = _one_tick(cluster)
            out["steady"] = _one_tick(cluster)
        finally:
            scancel(refs, conf)
    return out


def _held_jobs(n: int, cluster, team, user, conf: str) -> list[str]:
    """`n` held Slurm jobs and their ledger rows: PENDING jobs whose attempt has the job id."""
    from django.utils import timezone

    from jobs.models import Attempt, Job

    tag = uuid.uuid4().hex[:8]
    names = [f"sf-{tag}{i:05d}-a1" for i in range(n)]
    refs = []
    for name in names:
        out = slurm(
            "sbatch", "--parsable", "--hold", f"--job-name={name}", "--output=/dev/null",
            "--wrap=true", conf=conf,
        )  # fmt: skip
        refs.append(out.strip().split(";")[0])
    now = timezone.now()
    jobs = Job.objects.bulk_create(
        Job(
            run_id=name[3:-3], team=team, user=user, cluster=cluster, gpus=0,
            entrypoint=["true"], status="PENDING", attempt_count=1,
        )
        for name in names
    )  # fmt: skip
    attempts = Attempt.objects.bulk_create(
        Attempt(
            job=job, number=1, gpus=0, backend_name=name, job_ref=ref,
            submitted_at=now, pending_at=now,
        )
        for job, name, ref in zip(jobs, names, refs, strict=True)
    )  # fmt: skip
    for job, attempt in zip(jobs, attempts, strict=True):
        job.current_attempt = attempt
    Job.objects.bulk_update(jobs, ["current_attempt"])
    common.analyze()
    return refs


def _one_tick(cluster) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.executors import slurm as slurm_executor
    from jobs.loops.reconciler import reconcile_cluster
    from jobs.models import Job

    commands: list[str] = []
    real = slurm_executor._run_command

    def counting(argv, env, fds):
        commands.append(os.path.basename(argv[0]))
        return real(argv, env, fds)

    slurm_executor._run_command = counting
    try:
        with CaptureQueriesContext(connection) as ctx:
            t = time.perf_counter()
            reconcile_cluster(cluster)
            wall = time.perf_counter() - t
    finally:
        slurm_executor._run_command = real
    pending = Job.objects.filter(status="PENDING").count()
    return {
        "wall_s": round(wall, 3),
        "queries": len(ctx.captured_queries),
        "sql_s": round(sum(float(q["time"]) for q in ctx.captured_queries), 3),
        "slurm_commands": commands,
        "squeue_calls": commands.count("squeue"),
        "still_pending": pending,
    }
