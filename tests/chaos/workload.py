"""What a chaos round submits and does to its jobs: the teams and their mix of jobs, the pauses
and resumes a person would make, and the lender that takes its GPUs back.

Three teams submit with tight quotas (`TEAMS`); red, down to a quota of 1 with a borrow cap of
2, runs its 2-GPU jobs only on GPUs borrowed from gold (`LENDER`, quota 2, lendable) or from
blue (lendable) while blue has no GPU job waiting. Gold submits nothing up front: while the
faults go on, whenever a job runs on its GPUs and no job of its own is unfinished, it submits a
job that needs both (`Reclaims`), so the scheduler takes them back: a notice, SIGTERM, the
borrower PAUSED and queued again. Red's checkpointing jobs (`CKPT`) save their step under
SF_CHECKPOINT_DIR every few steps and at once when `sf.should_checkpoint()` says a notice came,
resume from it, and keep a journal beside it that the round's checks read
(`tests.chaos.invariants`).
"""

from __future__ import annotations

import contextlib
import random
import time
import urllib.error
from dataclasses import dataclass, field

from tests.chaos.services import ChaosStack, say

TEAMS = {  # name: (gpu_quota, max_jobs, user_gpu_cap) -- tight, so admission is contended
    "red": (2, 3, 2),
    "green": (1, 2, 1),
    "blue": (3, 4, 2),
}
LENDER = "gold"  # lends its whole quota while idle, and takes it back while the faults go on
LENDER_GPUS = 2
PY = "python3"
# "ckpt": red's checkpointing jobs on 2 GPUs, which it holds only borrowed (the other teams'
# jobs there are "ok": they are never preempted, and long jobs of theirs would only slow the
# round down on Slurm's 4 GPUs).
KINDS = ["ok", "ok", "flaky", "ckpt", "fail", "pause", "ok", "flaky", "keep_paused", "ckpt"]
BORROWER, CKPT_GPUS = "red", 2
JOURNAL = "journal.jsonl"  # the checkpointing job's record of its starts, saves and notices

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
# on borrowed GPUs), from the lender or from blue while blue is idle; with the stack's short
# minimum runtime, red's borrowers are preempted when the lender (or blue) wants its GPUs back.
lender, _ = Team.objects.update_or_create(
    name=LENDER, defaults=dict(gpu_quota=LENDER_GPUS, lendable=True, default_cluster=cluster))
Membership.objects.get_or_create(team=lender, user=demo, defaults={"role": "admin"})
Team.objects.filter(name="blue").update(lendable=True)
Team.objects.filter(name="red").update(gpu_quota=1, borrow_cap=2, user_gpu_cap=3)
"""

# The checkpointing job: STEPS steps of SLEEP s, its step saved every EVERY steps and when a
# notice came (then it exits 143, as a process ended by SIGTERM: not done). The journal's line
# for a save is written after the checkpoint file is replaced, so a resume never starts past
# the last save the journal shows; appends of one short line each, so attempts never interleave
# within a line.
CKPT = """
import json, os, sys, time
import sf
ckpt = os.environ["SF_CHECKPOINT_DIR"]
os.makedirs(ckpt, exist_ok=True)
attempt = int(os.environ["SF_ATTEMPT"])
def note(event, step):
    line = {"attempt": attempt, "event": event, "step": step, "at": time.time()}
    with open(os.path.join(ckpt, JOURNAL), "a") as fh:
        fh.write(json.dumps(line) + "\\n")
def save(step):
    with open(os.path.join(ckpt, "step.tmp"), "w") as fh:
        fh.write(str(step))
    os.replace(os.path.join(ckpt, "step.tmp"), os.path.join(ckpt, "step"))
    note("save", step)
path = os.path.join(ckpt, "step")
start = int(open(path).read()) if os.path.exists(path) else 0
note("start", start)
print("resuming from step", start, flush=True)
sf.should_checkpoint()
for step in range(start + 1, STEPS + 1):
    time.sleep(SLEEP)
    print("step", step, flush=True)
    noticed = sf.should_checkpoint()
    if step % EVERY == 0 or noticed:
        save(step)
    if noticed and step < STEPS:
        note("notice", step)
        print("notice received: checkpointed step", step, flush=True)
        sys.exit(143)
note("done", STEPS)
print("done", flush=True)
"""


# A checkpointing borrower runs some 10 s: past the stack's 2 s minimum runtime it must still
# hold the GPUs when the lender's reclaim reaches a tick, which on a loaded machine (three
# test runs at once) takes seconds; at 5 s the Slurm round's reclaims found their borrowers
# ended, and nothing was preempted.
def ckpt_code(steps: int = 25, sleep: float = 0.4, every: int = 4) -> str:
    values = {"STEPS": steps, "SLEEP": sleep, "EVERY": every, "JOURNAL": repr(JOURNAL)}
    return "".join(f"{name} = {value}\n" for name, value in values.items()) + CKPT


@dataclass
class Plan:
    """What was submitted, and which jobs the driver pauses, resumes or leaves paused."""

    ids: list[int] = field(default_factory=list)
    kinds: dict[int, str] = field(default_factory=dict)
    to_pause: list[int] = field(default_factory=list)  # paused, then resumed
    keep_paused: set[int] = field(default_factory=set)  # paused and left so
    paused_at: dict[int, float] = field(default_factory=dict)
    resumed: set[int] = field(default_factory=set)

    def add(self, job_id: int, kind: str) -> None:
        self.ids.append(job_id)
        self.kinds[job_id] = kind
        if kind == "pause":
            self.to_pause.append(job_id)
        elif kind == "keep_paused":
            self.keep_paused.add(job_id)

    def of_kind(self, kind: str) -> list[int]:
        return [job_id for job_id in self.ids if self.kinds[job_id] == kind]


def job_spec(i: int, rng: random.Random) -> tuple[str, dict]:
    """The i-th job: (kind, POST body). Short jobs; gpus 0-2 so quotas bind."""
    team = list(TEAMS)[i % len(TEAMS)]
    gpus = rng.choice([0, 1, 1, 2]) if team != "green" else rng.choice([0, 1])
    nap = round(rng.uniform(0.5, 2.5), 1)
    kind = KINDS[i % len(KINDS)]
    if kind == "ckpt" and team != BORROWER:
        kind = "ok"
    code = {
        "ok": f"import time; print('hello'); time.sleep({nap})",
        "flaky": f"import os,sys,time; time.sleep({nap}); "
        "sys.exit(3 if os.environ['SF_ATTEMPT'] == '1' else 0)",
        "fail": f"import sys,time; time.sleep({nap}); sys.exit(1)",
        "pause": "import time\nfor i in range(60):\n    print(i, flush=True); time.sleep(0.5)",
        "ckpt": ckpt_code(),
    }[kind if kind != "keep_paused" else "pause"]
    body = {
        "entrypoint": [PY, "-c", code],
        "gpus": CKPT_GPUS if kind == "ckpt" else gpus,
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
        plan.add(stack.call("POST", "/jobs", body)["id"], kind)
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


@dataclass
class Reclaims:
    """The lender's own work, submitted while its GPUs are lent: a job needing all of them,
    when a borrower runs on them, no job of the lender's is unfinished and `gap_s` has passed
    since the last one. The lender sees only its own figures; the driver, as staff, sees who
    borrowed from whom (`borrowed_from`)."""

    gap_s: float
    last: float = 0.0
    count: int = 0

    def tick(self, stack: ChaosStack, plan: Plan, jobs: dict[int, dict]) -> bool:
        """Submit the lender's job when it is due; whether it did."""
        now = time.monotonic()
        if now - self.last < self.gap_s:
            return False
        if any(not is_final(jobs[i], plan) for i in plan.of_kind("reclaim") if i in jobs):
            return False
        on_loan = [
            j["id"]
            for j in jobs.values()
            if j["status"] == "RUNNING" and j["borrowed_from"] == LENDER and not j["preempted_at"]
        ]
        if not on_loan:
            return False
        body = {
            "entrypoint": [PY, "-c", "import time; print('the lender works'); time.sleep(2)"],
            "gpus": LENDER_GPUS,
            "team": LENDER,
            "name": f"chaos-reclaim-{self.count}",
            "max_retries": 1,
            "retry_cooldown_s": 1,
        }
        job_id = stack.call("POST", "/jobs", body)["id"]
        plan.add(job_id, "reclaim")
        self.last, self.count = time.monotonic(), self.count + 1
        say(f"{LENDER} wants its GPUs back (job {job_id}) from jobs {on_loan}")
        return True
