"""Slurm benchmarks on the real Slurm of `.ci/slurm.sh` (started when it is not running, and
stopped afterwards only then).

`vs_sbatch`: the same short jobs (the job-side runner running `python -c pass`, offline: no API
server) submitted through Starforge's real path and straight with sbatch, side by side, three
runs in turn (aims: median submit→done <= 1.25x sbatch's, makespan <= 1.1x).
Starforge: `submit_job` in a process of its own (as the API server would), a worker
thread running `launch_attempts()` on the chunks the ticks hand it (the Celery `launch` task),
the main thread running beat's schedule tick (`admit_queued_jobs()`, then a LOOP_SLEEP_S
sleep) and another thread its reconcile tick (`reconcile_all()`, the same sleep): beat sends the
two as separate tasks, which a worker of concurrency 2 runs at once. sbatch: a submitting
thread runs sbatch, the main thread runs one squeue per loop with the same sleep. A job is
RUNNING / done when the loop first sees it so (the ledger's JobEvent times, the squeue poll's
clock). Production beat ticks every 2 s, which adds up to 2 s to what the ledger shows; both
sides here see the same cadence.

`reconcile_1000`: one reconciler tick over 1,000 PENDING Slurm jobs (held with `sbatch --hold`,
no GPUs): Slurm commands run, wall time and SQL statements, first tick and steady state.

`multinode`: 2-node jobs (one a100 GPU per node) on the `multi` partition, one at a time. Submit
→ every rank running, in turn through Starforge, straight with `sbatch --nodes 2` whose script
starts one srun per rank (what the runner does), and with `sbatch --nodes 2` running the runner
itself (so the last two differ by the runner alone, the first two by Starforge as a whole),
each submit at a random point of Slurm's scheduling cycle (see `_settle`), so the means compare.
`up`: when the last rank's own code started (its clock: every node is this host); `seen`: when
the loop first saw every rank running (the ledger's RUNNING with each rank of the attempt
running; `squeue -s` listing both rank steps). Each `up` splits into Slurm's wait (sbatch →
the batch step's first instruction, the same for every path but for luck) and the path's own
time (the rest: Starforge's before sbatch, the runner's or the script's in the job); `pooled`
puts every path's own time on the mean wait of all runs, a ratio without the luck of the
cycle. Then fail fast: one rank exits 3, and the time until no process of any rank (nor an
srun) is left, and until the ledger shows FAILED.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import shlex
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


def _setup(conf: str, name: str, **extra: str):
    from django.conf import settings

    from jobs.models import Cluster, Membership

    settings.SF_API_URL = ""  # offline runners: this compares orchestration, not log shipping
    work_dir = Path(os.environ["SF_VAR_DIR"]) / "slurm" / name
    cluster = Cluster.objects.create(
        name=name,
        kind="slurm",
        settings={"slurm_conf": conf, "work_dir": str(work_dir), **extra},
    )
    user = common.make_user()
    [team] = common.make_teams(1, quota=10_000, cluster=cluster)
    Membership.objects.create(team=team, user=user, role="member")
    return cluster, team, user


# --- Starforge vs sbatch --------------------------------------------------------------------


def vs_sbatch(n: int = 200, gpus: int = 0, runs: int = 3) -> dict:
    """`runs` side-by-side runs, sbatch then Starforge each time (so drift in the machine's
    load hits both alike). The top-level figures are the run with the median submit→done
    ratio; `each` has every run's. Aims: median submit→done <= 1.25x, makespan <= 1.1x."""
    with slurm_up() as conf:
        cluster, team, user = _setup(conf, "slurm-bench")
        each = []
        for i in range(runs):
            direct = _through_sbatch(n, gpus, conf, Path(os.environ["SF_VAR_DIR"]) / f"sbatch{i}")
            ours = _through_starforge(n, gpus, cluster, team, user)
            ratio = {
                key: round(ours[key] / direct[key], 2) if direct[key] else None
                for key in ("makespan_s", "running_median_s", "done_median_s")
            }
            each.append({"sbatch": direct, "starforge": ours, "ratio": ratio})
    middle = sorted(each, key=lambda run: run["ratio"]["done_median_s"] or 0)[runs // 2]
    return {
        "jobs": n,
        "gpus_per_job": gpus,
        "loop_sleep_s": LOOP_SLEEP_S,
        "runs": runs,
        **middle,
        "ratio_each": [run["ratio"] for run in each],
        "each": each,
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


class _Loops:
    """The Celery worker's `launch` tasks and beat's reconcile tick (which a second worker
    process runs), each on a thread of its own, timed."""

    def __init__(self) -> None:
        self.launches: queue.Queue[list[int] | None] = queue.Queue()
        self.launch_s: list[float] = []
        self.reconcile_s: list[float] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._launch), threading.Thread(target=self._tick)]
        for thread in self.threads:
            thread.start()

    def _launch(self) -> None:
        from django.db import connection

        from jobs.loops.launcher import launch_attempts

        try:
            while (chunk := self.launches.get()) is not None:
                t = time.perf_counter()
                launch_attempts(chunk)
                self.launch_s.append(time.perf_counter() - t)
        finally:
            connection.close()

    def _tick(self) -> None:
        from django.db import connection

        from jobs.loops.reconciler import reconcile_all

        try:
            while not self.stop.is_set():
                t = time.perf_counter()
                reconcile_all()
                self.reconcile_s.append(time.perf_counter() - t)
                self.stop.wait(LOOP_SLEEP_S)
        finally:
            connection.close()

    def close(self) -> None:
        self.stop.set()
        self.launches.put(None)
        for thread in self.threads:
            thread.join()


def _through_starforge(n: int, gpus: int, cluster, team, user, cleanup=None) -> dict:
    """Starforge's path for `n` jobs; the database may hold finished jobs of earlier runs.
    `cleanup(job_refs)` ends what a failed run left on the engine (default: scancel)."""
    from jobs.loops.scheduler import admit_queued_jobs
    from jobs.models import Attempt, Job
    from jobs.tasks import LAUNCH_CHUNK

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
    schedule_s: list[float] = []
    loops = _Loops()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while api.poll() is None or Job.objects.exclude(status="SUCCEEDED").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Starforge run: not done in {TIMEOUT_S} s")
            if Job.objects.filter(status="FAILED").exists():
                raise RuntimeError(f"Starforge job failed: {_first_failure()}")
            t = time.perf_counter()
            admitted = admit_queued_jobs().admitted  # beat's schedule tick
            for start in range(0, len(admitted), LAUNCH_CHUNK):
                loops.launches.put(admitted[start : start + LAUNCH_CHUNK])
            schedule_s.append(time.perf_counter() - t)
            time.sleep(LOOP_SLEEP_S)
    finally:
        loops.close()
        refs = list(Attempt.objects.exclude(job_ref="").values_list("job_ref", flat=True))
        if cleanup is None:
            scancel(refs, cluster.settings["slurm_conf"])
        else:
            cleanup(refs)
    stdout, _ = api.communicate()
    return _starforge_figures(stdout, schedule_s, loops.reconcile_s, loops.launch_s)


def _starforge_figures(
    stdout: str, schedule_s: list[float], reconcile_s: list[float], launch_s: list[float]
) -> dict:
    """A Starforge run's figures: its submits (what the API process printed), each job's RUNNING
    and SUCCEEDED events, and the loops' timings."""
    from jobs.models import JobEvent

    submitted = {int(k): v for k, v in json.loads(stdout).items()}
    events = JobEvent.objects.filter(to_status__in=["RUNNING", "SUCCEEDED"])
    running, done = {}, {}
    for job_id, to_status, at in events.values_list("job_id", "to_status", "time"):
        (running if to_status == "RUNNING" else done)[job_id] = at.timestamp()
    return {
        **_figures(submitted, running, done),
        "loop_iterations": len(schedule_s),
        "schedule_tick_max_s": round(max(schedule_s), 2),
        "reconcile_ticks": len(reconcile_s),
        "reconcile_tick_median_s": round(statistics.median(reconcile_s), 2),
        "reconcile_tick_max_s": round(max(reconcile_s), 2),
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
    spec = JobIn(entrypoint=["python", "-c", "pass"], gpus_per_node=gpus)
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
            run_id=name[3:-3], team=team, user=user, cluster=cluster, total_gpus=0,
            entrypoint=["true"], status="PENDING", attempt_count=1,
        )
        for name in names
    )  # fmt: skip
    attempts = Attempt.objects.bulk_create(
        Attempt(
            job=job, number=1, total_gpus=0, backend_name=name, job_ref=ref,
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

    from jobs.executors.slurm import executor as slurm_executor
    from jobs.loops.reconciler import reconcile_cluster
    from jobs.models import Job

    commands: list[str] = []
    real = slurm_executor.run_command

    def counting(argv, env, fds):
        commands.append(os.path.basename(argv[0]))
        return real(argv, env, fds)

    slurm_executor.run_command = counting
    try:
        with CaptureQueriesContext(connection) as ctx:
            t = time.perf_counter()
            reconcile_cluster(cluster)
            wall = time.perf_counter() - t
    finally:
        slurm_executor.run_command = real
    pending = Job.objects.filter(status="PENDING").count()
    return {
        "wall_s": round(wall, 3),
        "queries": len(ctx.captured_queries),
        "sql_s": round(sum(float(q["time"]) for q in ctx.captured_queries), 3),
        "slurm_commands": commands,
        "squeue_calls": commands.count("squeue"),
        "still_pending": pending,
    }


# --- multi-node jobs --------------------------------------------------------------------------

GANG_NODES = 2
SLURM_CYCLE_S = 2  # sched_interval and bf_interval of .ci/slurm.sh
# One rank: "up" writes when it started and stays a moment; "fail": rank 0 writes its pid and
# sleeps, the last rank waits for that, writes when it fails and exits 3.
RANK = """
import os, sys, time
mode, out = sys.argv[1], sys.argv[2]
rank = int(os.environ["SF_NODE_RANK"])
open(f"{out}/up{rank}", "w").write(repr(time.time()))
if mode == "up":
    time.sleep(1)
elif rank == 0:
    open(f"{out}/pid0", "w").write(str(os.getpid()))
    time.sleep(300)
else:
    while not os.path.exists(f"{out}/pid0"):
        time.sleep(0.01)
    open(f"{out}/failed_at", "w").write(repr(time.time()))
    sys.exit(3)
"""


def multinode(jobs: int = 15, failures: int = 5) -> dict:
    work = Path(os.environ["SF_VAR_DIR"]) / "gang"
    work.mkdir()
    script = work / "rank.py"
    script.write_text(RANK)
    python = _stamping_python(work)
    with slurm_up() as conf:
        _setup(conf, "slurm-multi", partition="multi", python=str(python))
        phase = random.Random(0)
        ours, direct, runner = [], [], []
        for i in range(jobs):  # in turn: drift in the machine's load hits all three alike
            _settle(conf, phase)
            direct.append(_gang_through_sbatch(conf, script, work / f"sbatch-{i}"))
            _settle(conf, phase)
            runner.append(_gang_through_sbatch(conf, script, work / f"runner-{i}", python))
            _settle(conf, phase)
            ours.append(_gang_through_starforge(script, work / f"sf-{i}"))
        fails = []
        for i in range(failures):
            _settle(conf, phase)
            fails.append(_fail_fast(script, work / f"fail-{i}"))
    vs = {
        "sbatch": _gang_figures(direct),
        "sbatch_runner": _gang_figures(runner),
        "starforge": _gang_figures(ours),
    }
    wait = statistics.mean(r["up_s"] - r["own_s"] for r in [*direct, *runner, *ours])
    for figures in (vs["sbatch"], vs["sbatch_runner"], vs["starforge"]):
        figures["pooled_s"] = round(figures["own_mean_s"] + wait, 2)
    keys = ("up_mean_s", "up_median_s", "seen_mean_s", "pooled_s")
    vs["ratio"] = {key: _ratio(vs["starforge"], vs["sbatch"], key) for key in keys}
    # The same with the runner in the sbatch job too: Starforge's orchestration alone
    vs["ratio_to_runner"] = {key: _ratio(vs["starforge"], vs["sbatch_runner"], key) for key in keys}
    gone = [f["gone_s"] for f in fails]
    ledger = [f["ledger_failed_s"] for f in fails]
    return {
        "jobs": jobs,
        "nodes": GANG_NODES,
        "loop_sleep_s": LOOP_SLEEP_S,
        **vs,
        "fail_fast": {
            "runs": failures,
            "gone_median_s": round(statistics.median(gone), 2),
            "gone_max_s": round(max(gone), 2),
            "ledger_failed_median_s": round(statistics.median(ledger), 2),
        },
    }


def _gang_through_sbatch(conf: str, script: Path, out: Path, runner: Path | None = None) -> dict:
    """One 2-node job straight to `sbatch --nodes 2`: its script starts one srun per rank, as a
    Slurm user writes it, or it is Starforge's runner (under the stamping `runner` python),
    which does that itself."""
    from sf.contract import GPUS_PER_NODE_VAR, NUM_NODES_VAR, RANK_LAUNCH_VAR, file_env

    out.mkdir()
    argv = [sys.executable, str(script), "up", str(out)]
    env = {**os.environ, "SLURM_CONF": conf}
    if runner:
        wrap = f"exec {runner} -m sf.runner"
        env.update(file_env(out), SF_API_URL="", SF_SNAPSHOT="", SF_ENTRYPOINT=json.dumps(argv))
        env.update(
            {RANK_LAUNCH_VAR: "srun", NUM_NODES_VAR: str(GANG_NODES), GPUS_PER_NODE_VAR: "1"}
        )
    else:
        wrap = f"date +%s.%N >{out}/batch_at; " + (
            " ".join(
                f"SF_NODE_RANK={r} srun --nodes=1 --ntasks=1 --relative={r} --kill-on-bad-exit=1 "
                f"--gres=gpu:1 --job-name=rank{r} --quiet {shlex.join(argv)} &"
                for r in range(GANG_NODES)
            )
            + " wait"
        )
    t = time.time()
    job_id = subprocess.run(
        ["sbatch", "--parsable", f"--job-name=bl-gang-{out.name}", "-p", "multi",
         f"--nodes={GANG_NODES}", "--ntasks-per-node=1", "--gres=gpu:a100:1",
         f"--output={out}/slurm.out", f"--wrap={wrap}"],
        env=env, check=True, capture_output=True, text=True,
    ).stdout.strip().split(";")[0]  # fmt: skip
    seen = None
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        if time.monotonic() > deadline:
            raise RuntimeError(f"sbatch gang {job_id}: not done in {TIMEOUT_S} s")
        steps = slurm("squeue", "-s", "-h", "-j", job_id, "-O", "StepName:|,StepState:|",
                      conf=conf)  # fmt: skip
        running = {line for line in steps.splitlines() if line.endswith("|RUNNING|")}
        if seen is None and len(running & _rank_steps()) == GANG_NODES:
            seen = time.time()
        state = slurm("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", conf=conf).strip()
        if state not in ACTIVE and state != "PENDING":
            break
        time.sleep(LOOP_SLEEP_S)
    if state != "COMPLETED" or seen is None:
        raise RuntimeError(f"sbatch gang {job_id} ended {state}, ranks seen running: {seen}")
    return _times(t, t, out, out, seen)


def _stamping_python(work: Path) -> Path:
    """This interpreter behind a script that first writes the time to `batch_at` beside the
    run dir (the attempt dir): when the batch step began, before the runner's own start-up."""
    path = work / "python"
    path.write_text(
        "#!/bin/sh\n"
        'date +%s.%N >"$(dirname "$SF_RUN_DIR")/batch_at"\n'
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    path.chmod(0o755)
    return path


def _times(t: float, sbatch_at: float, out: Path, attempt_dir: Path, seen: float) -> dict:
    """A path's figures from submit time `t`: `own_s` is `up_s` less Slurm's wait (sbatch →
    the batch step's first instruction)."""
    up = _last_up(out) - t
    waited = float((attempt_dir / "batch_at").read_text()) - sbatch_at
    return {"up_s": up, "seen_s": seen - t, "own_s": up - waited}


def _settle(conf: str, phase: random.Random) -> None:
    """Wait until both nodes are idle (the last job's end fully done), then a random part of
    Slurm's scheduling cycle: a batch job starts on the next pass of the main or backfill
    scheduler (every SLURM_CYCLE_S here; Slurm defers its at-submit try while one ran within
    batch_sched_delay, 3 s), so a submit waits for a share of the cycle that depends on when
    it comes. Coming at random points of it, every path waits alike on average, and a fixed
    delay before sbatch (Starforge's) adds to the mean one for one."""
    deadline = time.monotonic() + TIMEOUT_S
    args = ("sinfo", "-h", "-N", "-p", "multi", "-o", "%t")
    while slurm(*args, conf=conf).split() != ["idle"] * GANG_NODES:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the multi nodes did not come back idle in {TIMEOUT_S} s")
        time.sleep(0.05)
    time.sleep(phase.uniform(0, SLURM_CYCLE_S))


def _rank_steps() -> set[str]:
    return {f"rank{r}|RUNNING|" for r in range(GANG_NODES)}


def _gang_through_starforge(script: Path, out: Path) -> dict:
    """The same job through `submit_job` and beat's ticks (the submit kicks the first)."""
    from jobs.executors.slurm import executor as slurm_executor
    from jobs.models import Job

    out.mkdir()
    sbatch_at: list[float] = []
    real = slurm_executor.run_command

    def stamped(argv, env, fds):
        if argv[0].endswith("sbatch"):
            sbatch_at.append(time.time())
        return real(argv, env, fds)

    slurm_executor.run_command = stamped
    t = time.time()
    job = _submit_gang([sys.executable, str(script), "up", str(out)])
    seen = None

    def done() -> bool:
        nonlocal seen
        row = Job.objects.select_related("current_attempt").get(pk=job.pk)
        ranks = row.current_attempt.ranks if row.current_attempt else []
        if seen is None and row.status == "RUNNING" and len(ranks) == GANG_NODES:
            if all(r["state"] == "running" for r in ranks):
                seen = time.time()
        if row.status == "FAILED":
            raise RuntimeError(f"Starforge gang failed: {row.status_reason}")
        return row.status == "SUCCEEDED"

    try:
        _tick_until(done)
    finally:
        slurm_executor.run_command = real
    if seen is None:
        raise RuntimeError("the ledger never showed every rank of the gang running")
    attempt = Job.objects.select_related("current_attempt", "cluster").get(pk=job.pk)
    attempt_dir = Path(attempt.cluster.settings["work_dir"]) / attempt.current_attempt.backend_name
    return _times(t, sbatch_at[0], out, attempt_dir, seen)


def _fail_fast(script: Path, out: Path) -> dict:
    """One rank exits 3: how long until no process of the job is left, and until the ledger
    shows the job FAILED, from the failing rank's own clock."""
    from jobs.models import Job

    out.mkdir()
    job = _submit_gang([sys.executable, str(script), "fail", str(out)])
    gone: list[float] = []
    watcher = threading.Thread(target=_watch_ranks_end, args=(out, gone), daemon=True)
    watcher.start()
    _tick_until(lambda: Job.objects.get(pk=job.pk).status == "FAILED")
    failed = time.time()
    reason = Job.objects.get(pk=job.pk).status_reason
    if not reason.startswith("rank 1 on "):
        raise RuntimeError(f"fail fast: not rank 1's failure: {reason!r}")
    watcher.join(timeout=60)
    if not gone:
        raise RuntimeError("fail fast: a process of the ranks was still there a minute on")
    at = float((out / "failed_at").read_text())
    return {"gone_s": gone[0] - at, "ledger_failed_s": failed - at}


def _watch_ranks_end(out: Path, gone: list[float]) -> None:
    """Appends to `gone` the time when no process mentions `out` any more (the ranks and their
    sruns; every node is this host), once rank 0 has started and a rank has failed."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (out / "failed_at").exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    while time.monotonic() < deadline:
        if not _processes_mentioning(str(out)):
            gone.append(time.time())
            return
        time.sleep(0.02)


def _processes_mentioning(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
    return found


def _submit_gang(entrypoint: list[str]):
    from django.contrib.auth.models import User

    from jobs import kick
    from jobs.actions.submit import submit_job
    from jobs.schemas import JobIn

    kick.scheduler = lambda: None  # the loop below is the tick the submit would kick
    spec = JobIn(entrypoint=entrypoint, gpus_per_node=1, nodes=GANG_NODES, gpu_type="a100")
    return submit_job(User.objects.get(username="bench"), spec)


def _tick_until(done) -> None:
    """Beat's ticks, back to back with LOOP_SLEEP_S between, the launch inline (the Celery
    worker takes it at once), until `done()`."""
    from jobs.loops.launcher import launch_attempts
    from jobs.loops.reconciler import reconcile_all
    from jobs.loops.scheduler import admit_queued_jobs

    deadline = time.monotonic() + TIMEOUT_S
    while True:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Starforge gang: not done in {TIMEOUT_S} s")
        admitted = admit_queued_jobs().admitted
        if admitted:
            launch_attempts(admitted)
        reconcile_all()
        if done():
            return
        time.sleep(LOOP_SLEEP_S)


def _last_up(out: Path) -> float:
    return max(float((out / f"up{r}").read_text()) for r in range(GANG_NODES))


def _ratio(ours: dict, theirs: dict, key: str) -> float | None:
    return round(ours[key] / theirs[key], 2) if theirs[key] else None


def _gang_figures(runs: list[dict]) -> dict:
    up, seen = [r["up_s"] for r in runs], [r["seen_s"] for r in runs]
    return {
        "own_mean_s": round(statistics.mean(r["own_s"] for r in runs), 2),
        "slurm_wait_mean_s": round(statistics.mean(r["up_s"] - r["own_s"] for r in runs), 2),
        "up_mean_s": round(statistics.mean(up), 2),
        "up_median_s": round(statistics.median(up), 2),
        "up_max_s": round(max(up), 2),
        "seen_mean_s": round(statistics.mean(seen), 2),
        "seen_max_s": round(max(seen), 2),
    }
