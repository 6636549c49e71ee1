"""The round's own checks, beside `check_ledger`: preemptions, billing, the lenders' quotas over
time, the checkpointing jobs' journals and what is left on the engine.

They read behaviour only: the ledger's rows and events (one `manage.py shell` dump), the API's
jobs, the journals the checkpointing jobs wrote (`tests.chaos.workload.CKPT`) and the engine
(`starforge_objects`, and the host's processes). Each check returns violations, one sentence
each; `Figures` counts what the round exercised.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.chaos.services import ChaosStack
from tests.chaos.workload import JOURNAL

LEDGER = """
import json
from django.conf import settings
from jobs.models import Attempt, JobEvent, Team
from metering.models import UsageRecord
def rows(query, *names):
    return [dict(zip(names, row)) for row in query.values_list(*names)]
preempted = Attempt.objects.filter(preempted_at__isnull=False).values("job_id")
print(json.dumps({
    "min_runtime_s": settings.SF_PREEMPT_MIN_RUNTIME_S,
    "teams": rows(Team.objects.all(), "name", "gpu_quota", "borrow_cap"),
    "attempts": rows(
        Attempt.objects.order_by("job_id", "number"), "job_id", "number", "job__team__name",
        "borrowed_from__name", "submitted_at", "start_time", "end_time",
        "preempted_at", "end_reason", "metered"),
    "events": rows(
        JobEvent.objects.filter(job_id__in=preempted, kind__in=["status", "note"])
        .order_by("job_id", "time", "id"), "job_id", "time", "kind", "to_status", "reason"),
    "usage": rows(
        UsageRecord.objects.all(), "team__name", "gpu_us", "deleted_gpu_us", "borrowed_gpu_us"),
}, default=str))
"""

ENGINE = """
import json
from jobs.executors import executor_for
from jobs.models import Cluster
held = {}
for cluster in Cluster.objects.filter(enabled=True).exclude(kind=Cluster.Kind.NOOP):
    held.update(executor_for(cluster).starforge_objects())
print(json.dumps(sorted(held)))
"""

NOTICE = "preemption notice"  # the borrower's note when its notice goes out
PREEMPTED = "preempted"  # the reason of the PAUSED that ends a preempted attempt
ENDS = {"SUCCEEDED", "FAILED", "STOPPED", "PAUSED"}
ONE_US = dt.timedelta(microseconds=1)


@dataclass
class Figures:
    """What the round's preemptions came to."""

    borrowed: int = 0  # attempts on borrowed GPUs
    preempted: int = 0  # attempts told to give them back (preempted_at)
    paused: int = 0  # of those, ended PAUSED by the preemption
    resumed: int = 0  # of those, whose job ran another attempt afterwards
    noticed: int = 0  # checkpointing attempts that saved their step on the notice
    from_checkpoint: int = 0  # attempts after a preemption that started from a saved step > 0
    before_notice: int = 0  # preempted attempts that had exited 0 before the notice went out
    ended_otherwise: int = 0  # preempted attempts ended another way (with its reason)

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in dataclasses.asdict(self).items())


@dataclass
class Ledger:
    """The dump, by job, with times parsed."""

    min_runtime_s: float
    teams: dict[str, dict]
    attempts: dict[int, list[dict]]
    events: dict[int, list[dict]] = field(default_factory=dict)
    usage: list[dict] = field(default_factory=list)

    @classmethod
    def read(cls, stack: ChaosStack, api_jobs: dict[int, dict]) -> Ledger:
        """The dump, each attempt with its job's GPUs in all as the API answers them (`gpus`:
        every attempt of a job holds the same)."""
        raw = json.loads(stack.manage("shell", "-c", LEDGER).stdout.strip().splitlines()[-1])
        attempts: dict[int, list[dict]] = defaultdict(list)
        for row in raw["attempts"]:
            row["gpus"] = api_jobs[row["job_id"]]["gpus"]
            attempts[row["job_id"]].append(_times(row))
        events: dict[int, list[dict]] = defaultdict(list)
        for row in raw["events"]:
            events[row["job_id"]].append(_times(row))
        return cls(
            raw["min_runtime_s"],
            {t["name"]: t for t in raw["teams"]},
            dict(attempts),
            dict(events),
            raw["usage"],
        )

    def all_attempts(self) -> Iterator[dict]:
        for rows in self.attempts.values():
            yield from rows


def _times(row: dict) -> dict:
    for key in ("time", "submitted_at", "start_time", "end_time", "preempted_at"):
        if isinstance(row.get(key), str):
            row[key] = dt.datetime.fromisoformat(row[key])
    return row


# -- preemptions -------------------------------------------------------------------------------


def preemptions(ledger: Ledger, figures: Figures) -> list[str]:
    """Every preempted attempt was on borrowed GPUs, had run the minimum runtime, got its
    notice (one note per preemption), and ended: PAUSED by the preemption and then queued again
    (or stopped, with a reason), SUCCEEDED only where it ended before the notice, or another
    way with a reason; the job's next attempt began after it ended."""
    found: list[str] = []
    figures.borrowed = sum(1 for a in ledger.all_attempts() if a["borrowed_from__name"])
    for job_id, attempts in ledger.attempts.items():
        preempted = [a for a in attempts if a["preempted_at"] is not None]
        if not preempted:
            continue
        events = ledger.events.get(job_id, [])
        notices = [e for e in events if e["kind"] == "note" and e["reason"].startswith(NOTICE)]
        if len(notices) != len(preempted):
            found.append(
                f"job {job_id}: {len(preempted)} preempted attempt(s) but {len(notices)} "
                "preemption notice(s) in its events"
            )
        for attempt in preempted:
            figures.preempted += 1
            found += _preempted_attempt(ledger, job_id, attempt, attempts, events, figures)
    return found


def _preempted_attempt(
    ledger: Ledger,
    job_id: int,
    attempt: dict,
    attempts: list[dict],
    events: list[dict],
    figures: Figures,
) -> list[str]:
    """One preempted attempt: see `preemptions`."""
    where = f"job {job_id} attempt {attempt['number']}"
    told, start, end = attempt["preempted_at"], attempt["start_time"], attempt["end_time"]
    found = []
    if not attempt["borrowed_from__name"]:
        found.append(f"{where}: preempted but it ran on its own team's quota")
    if start is None or (told - start).total_seconds() < ledger.min_runtime_s:
        ran = "never started" if start is None else f"ran {(told - start).total_seconds():.1f} s"
        found.append(f"{where}: preempted at {told:%H:%M:%S.%f} but it {ran}, under the minimum")
    if end is None:
        return [*found, f"{where}: preempted at {told:%H:%M:%S} and never ended"]
    ended, paused = _how_it_ended(where, attempt, events, figures)
    later = [a for a in attempts if a["number"] == attempt["number"] + 1]
    if later:
        figures.resumed += paused
        if later[0]["submitted_at"] < end:
            found.append(f"{where}: attempt {later[0]['number']} was admitted before it ended")
    return found + ended


def _how_it_ended(
    where: str, attempt: dict, events: list[dict], figures: Figures
) -> tuple[list[str], bool]:
    """The status event that ended a preempted attempt, against the rules; whether it was the
    preemption's PAUSED."""
    told, end = attempt["preempted_at"], attempt["end_time"]
    after = [e for e in events if e["kind"] == "status" and e["time"] >= told]
    ending = next((e for e in after if e["to_status"] in ENDS), None)
    if ending is None:
        return [f"{where}: ended at {end:%H:%M:%S} with no status event ending it"], False
    status, reason = ending["to_status"], ending["reason"]
    if status == "PAUSED" and reason.startswith(PREEMPTED):
        figures.paused += 1
        then = next((e for e in after if e["time"] > ending["time"]), None)
        if then is None:
            return [f"{where}: PAUSED by its preemption and never queued again"], True
        if then["to_status"] not in ("QUEUED", "STOPPED") or not then["reason"]:
            return [f"{where}: after its preemption, {then['to_status']} {then['reason']!r}"], True
        return [], True
    if status == "SUCCEEDED" and end > told:
        return [f"{where}: SUCCEEDED at {end:%H:%M:%S.%f}, after its notice: not PAUSED"], False
    if status == "SUCCEEDED":
        figures.before_notice += 1
        return [], False
    figures.ended_otherwise += 1
    return ([] if reason else [f"{where}: preempted, then {status} with no reason"]), False


# -- billing and quotas over time --------------------------------------------------------------


def billing(ledger: Ledger) -> list[str]:
    """Every attempt that ended is metered, once: each team's usage records add up to its
    attempts' running time x GPUs, to the microsecond, in all and on borrowed GPUs."""
    found = []
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for a in ledger.all_attempts():
        if a["end_time"] is None:
            continue
        if not a["metered"] and a["start_time"] is not None:
            found.append(f"job {a['job_id']} attempt {a['number']}: ended but not metered")
        if a["start_time"] is None or not a["metered"]:
            continue
        us = (a["end_time"] - a["start_time"]) // ONE_US * a["gpus"]
        expected[a["job__team__name"]][0] += us
        expected[a["job__team__name"]][1] += us if a["borrowed_from__name"] else 0
    recorded: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in ledger.usage:
        recorded[row["team__name"]][0] += row["gpu_us"] - row["deleted_gpu_us"]
        recorded[row["team__name"]][1] += row["borrowed_gpu_us"]
    for team in sorted(expected.keys() | recorded.keys()):
        if recorded[team] != expected[team]:
            found.append(
                f"team {team}: billed {recorded[team][0]} GPU-µs ({recorded[team][1]} borrowed), "
                f"its attempts ran {expected[team][0]} ({expected[team][1]} borrowed)"
            )
    return found


def quotas_over_time(ledger: Ledger) -> list[str]:
    """At no moment did the attempts running on a team's quota (its own, and those that
    borrowed from it) hold more GPUs than the quota, nor a team's borrowers more than its
    borrow cap: a lender's job starts only once the GPUs it took back are given back."""
    steps: list[tuple[dt.datetime, int, str, dict]] = []
    for a in ledger.all_attempts():
        if a["start_time"] is None or not a["gpus"]:
            continue
        holders = [("quota", a["borrowed_from__name"] or a["job__team__name"])]
        if a["borrowed_from__name"]:
            holders.append(("borrow cap", a["job__team__name"]))
        for holder in holders:
            key = f"{holder[0]}:{holder[1]}"
            steps.append((a["start_time"], a["gpus"], key, a))
            if a["end_time"] is not None:
                steps.append((a["end_time"], -a["gpus"], key, a))
    found, held, told = [], defaultdict(int), set()
    for at, gpus, key, a in sorted(steps, key=lambda s: (s[0], s[1])):  # ends first
        held[key] += gpus
        kind, team = key.split(":")
        limit = ledger.teams[team]["gpu_quota" if kind == "quota" else "borrow_cap"] or 0
        if gpus > 0 and held[key] > limit and key not in told:
            told.add(key)
            found.append(
                f"team {team}: {held[key]} GPUs on its {kind} ({limit}) at {at:%H:%M:%S.%f}, "
                f"when job {a['job_id']} attempt {a['number']} started"
            )
    return found


# -- the checkpointing jobs' journals ----------------------------------------------------------


def journals(
    ledger: Ledger, api_jobs: dict[int, dict], ckpt_ids: list[int], figures: Figures
) -> list[str]:
    """Each checkpointing job's attempts ran one after another (no line of an attempt after
    the next one started), each started from the last step saved before it, and one that
    SUCCEEDED finished its steps; figures: saves on a notice, starts from a checkpoint after a
    preemption."""
    found = []
    for job_id in ckpt_ids:
        job = api_jobs.get(job_id)
        if job is None:
            continue
        lines = read_journal(Path(job["output_dir"]) / "checkpoints" / JOURNAL)
        attempts = {a["number"]: a for a in ledger.attempts.get(job_id, [])}
        found += check_journal(job_id, lines, attempts, figures)
        if job["status"] == "SUCCEEDED" and (not lines or lines[-1]["event"] != "done"):
            found.append(f"job {job_id}: SUCCEEDED but its journal does not end with done")
    return found


def check_journal(
    job_id: int, lines: list[dict], attempts: dict[int, dict], figures: Figures
) -> list[str]:
    """One job's journal against its attempts (see `journals`)."""
    found, newest, saved = [], 0, 0
    for line in lines:
        number, event, step = line["attempt"], line["event"], line["step"]
        if number < newest:
            found.append(f"job {job_id}: attempt {number} wrote {event} after {newest} began")
        newest = max(newest, number)
        if event == "start":
            if step != saved:
                found.append(
                    f"job {job_id}: attempt {number} started from step {step}, "
                    f"but the last step saved was {saved}"
                )
            before = attempts.get(number - 1, {})
            figures.from_checkpoint += bool(step and before.get("preempted_at"))
        elif event == "save":
            saved = step
        elif event == "notice" and attempts.get(number, {}).get("preempted_at"):
            figures.noticed += 1
    return found


def read_journal(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- the engine --------------------------------------------------------------------------------


def left_running(stack: ChaosStack, run_ids: set[str], wait_s: float = 60) -> list[str]:
    """Once every job is final, nothing of theirs runs: the engine holds no object for
    Starforge and no process on this host carries one of the round's run ids (a job's or a
    runner's). Waits up to `wait_s` for what is still ending (a Slurm job COMPLETING)."""
    deadline = time.monotonic() + wait_s
    while True:
        out = stack.manage("shell", "-c", ENGINE).stdout.strip().splitlines()
        held = json.loads(out[-1]) if out else ["(no answer)"]
        alive = _processes_of(run_ids)
        if (not held and not alive) or time.monotonic() > deadline:
            break
        time.sleep(2)
    found = [f"the engine still holds {ref} after every job ended" for ref in held]
    found += [f"process {pid} of run {run} still runs after every job ended" for pid, run in alive]
    return found


def _processes_of(run_ids: set[str]) -> list[tuple[int, str]]:
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            run = proc.environ().get("SF_RUN_ID")
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
        if run in run_ids:
            alive.append((proc.pid, run))
    return alive
