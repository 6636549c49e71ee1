"""Owns `sf job`: its verbs' parser, and one job shown (status, why), controlled (stop, pause,
resume, retry) or deleted; `sf job list`, `sf job logs` and `sf job attempts` have modules of
their own, and an array's id (`aN`) goes to `sf.commands.arrays`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sf.commands import attempts, listing, logs
from sf.commands.arrays import act_on_array, array_id, show_array
from sf.commands.common import (
    api_client,
    display,
    job_id,
    print_json,
    usage_error,
    when,
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    job = sub.add_parser("job", parents=[common], help="inspect and control jobs")
    verbs = job.add_subparsers(title="job commands", metavar="VERB")
    status = verbs.add_parser("status", parents=[common], help="show one job (default: latest)")
    status.add_argument("id", nargs="?", help="job id (default: your latest job)")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_status, parser=status)
    why = verbs.add_parser(
        "why", parents=[common], help="why a job is where it is (default: latest)"
    )
    why.add_argument("id", nargs="?", help="job id (default: your latest job)")
    why.add_argument("--json", action="store_true")
    why.set_defaults(handler=cmd_why, parser=why)
    listing.add_parser(verbs, common)
    logs.add_parser(verbs, common)
    attempts.add_parser(verbs, common)
    for verb in ("stop", "pause", "resume", "retry"):
        p = verbs.add_parser(verb, parents=[common], help=f"{verb} a job (default: latest)")
        p.add_argument(
            "id", nargs="?", help="job id, or aN for every task of array N (default: latest job)"
        )
        p.add_argument("--json", action="store_true")
        if verb == "retry":
            p.add_argument(
                "--failed", action="store_true", help="with an array: its FAILED tasks only"
            )
        p.set_defaults(handler=cmd_action, parser=p, verb=verb)
    delete = verbs.add_parser("delete", parents=[common], help="delete a finished job")
    delete.add_argument("id", help="job id (required: deleting is not undone)")
    delete.set_defaults(handler=cmd_delete, parser=delete)
    job.set_defaults(handler=None, parser=job)


STATUS_FIELDS = (
    "id",
    "name",
    "run_id",
    "team",
    "user",
    "cluster",
    "status",
    "status_reason",
    "attempt",
    "retry_count",
    "retries_left",
    "next_attempt_at",
    "time_limit_s",
    "retry_available",
    "job_ref",
    "total_gpus",
    "cpus",
    "memory_mb",
    "image",
    "submitted_at",
    "started_at",
    "ended_at",
    "exit_code",
    "gpu_seconds",
    "output_dir",
    "parent",
    "then",
)


STATUS_LABELS = {"memory_mb": "memory", "time_limit_s": "time limit", "total_gpus": "gpus"}


STATUS_IF_SET = ("cpus", "memory_mb", "image")  # what the job asked for, if it did


def cmd_status(args: argparse.Namespace) -> None:
    """Show one job as aligned `key: value` lines (or JSON); a multi-node job's ranks after."""
    client = api_client(args)
    array = array_id(args.id)
    if array is not None:
        show_array(client, args, array)
        return
    job = client.request("GET", f"/api/v1/jobs/{job_id(client, args)}")
    if args.json:
        print_json(job)
        return
    lines = [
        f"{STATUS_LABELS.get(key, key) + ':':<15} {_status_value(job, key)}"
        for key in STATUS_FIELDS
        if key not in STATUS_IF_SET or job.get(key) not in (None, "")
    ]
    if job.get("status") == "QUEUED":
        lines += _queue_lines(job)
    if job.get("borrowed_from"):  # staff only: a borrower never learns who lent
        lines.append(f"{'borrowed from:':<15} team {job['borrowed_from']} (preemptible)")
    elif job.get("borrowed"):
        lines.append(f"{'borrowed:':<15} another team's idle GPUs (preemptible)")
    if job.get("preempted_at"):
        lines.append(
            f"{'preempted:':<15} at {when(job['preempted_at'])[11:]} UTC, SIGKILL at "
            f"{when(job.get('preempt_kill_at'))[11:]} UTC unless it exits first"
        )
    if (job.get("nodes") or 1) > 1:
        lines += ["ranks:", *_rank_table(job.get("ranks") or [])]
    sys.stdout.write("\n".join(lines) + "\n")


def _queue_lines(job: dict) -> list[str]:
    """A QUEUED job's place in line and its estimated start, as the last scheduler tick saw."""
    position = job.get("queue_position")
    if position is None:
        return [f"{'position:':<15} {display(job.get('estimate_reason'))}"]
    place = f"{position} on its cluster, {display(job.get('team_queue_position'))} in its team"
    ahead = job.get("ahead_jobs") or 0
    if ahead:
        place += f"; {ahead} job(s) asking for {display(job.get('ahead_gpus'))} GPU(s) ahead"
    start = job.get("estimated_start")
    when = (
        f"by {str(start)[:19].replace('T', ' ')} UTC (if running jobs run to their time limits)"
        if start
        else f"none: {display(job.get('estimate_reason'))}"
    )
    return [f"{'position:':<15} {place}", f"{'est. start:':<15} {when}"]


def _rank_table(ranks: list[dict]) -> list[str]:
    """The ranks as aligned columns (no rich: `sf job status` stays fast)."""
    if not ranks:
        return ["  none reported yet"]
    rows = [("RANK", "NODE", "STATE", "EXIT")] + [
        (
            display(r.get("rank")),
            display(r.get("node")),
            display(r.get("state")),
            display(r.get("exit_code")),
        )
        for r in ranks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[3]
        for row in rows
    ]


def cmd_why(args: argparse.Namespace) -> None:
    """Print the job's Diagnostics: why it waits, runs, or ended where it is."""
    client = api_client(args)
    answer = client.request("GET", f"/api/v1/jobs/{job_id(client, args)}/diagnostics")
    if args.json:
        print_json(answer)
        return
    sys.stdout.write(f"{answer['status']}\n" + "".join(f"- {s}\n" for s in answer["sentences"]))


def _status_value(job: dict, key: str) -> str:
    if key == "cluster" and job.get("backend"):
        return f"{display(job.get('cluster'))} ({job['backend']})"
    if key == "total_gpus":
        return _gpus(job)
    if key == "cpus":
        return f"{job['cpus']} per node"
    if key == "memory_mb":
        return f"{_mib(job['memory_mb'])} per node"
    if key == "retry_available":
        return "yes" if job.get(key) else f"no ({job.get('retry_unavailable_reason', '')})"
    if key == "then":
        return ", ".join(job.get(key) or []) or "-"
    if key == "time_limit_s":
        from sf.project import say_duration

        return say_duration(job[key]) if job.get(key) else "none"
    return display(job.get(key))


def _gpus(job: dict) -> str:
    """GPUs in all, and how they are made up: "8 (2 nodes × 4 a100)", "1 (a100)"."""
    nodes, kind = job.get("nodes") or 1, job.get("gpu_type") or ""
    parts = []
    if nodes > 1:
        parts.append(
            f"{nodes} nodes × {display(job.get('gpus_per_node'))}" + (f" {kind}" if kind else "")
        )
    elif kind:
        parts.append(kind)
    if job.get("virtual_gpus"):
        parts.append("virtual slots")
    return display(job.get("total_gpus")) + (f" ({', '.join(parts)})" if parts else "")


def _mib(mib: int) -> str:
    """A size in MiB in the largest binary unit it reaches: 65536 is "64 GiB"."""
    for unit, size in (("TiB", 1024 * 1024), ("GiB", 1024)):
        if mib >= size:
            return f"{mib / size:.4g} {unit}"
    return f"{mib} MiB"


def cmd_action(args: argparse.Namespace) -> None:
    """POST stop/pause/resume/retry and print the resulting status."""
    client = api_client(args)
    array = array_id(args.id)
    if array is not None:
        act_on_array(client, args, array)
        return
    if getattr(args, "failed", False):
        usage_error(args.parser, "--failed goes with an array id: sf job retry aN --failed")
    job = client.request("POST", f"/api/v1/jobs/{job_id(client, args)}/{args.verb}")
    if args.json:
        print_json(job)
        return
    reason = job.get("status_reason")
    print(f"job {job.get('id')}: {job.get('status')}" + (f" ({reason})" if reason else ""))


def cmd_delete(args: argparse.Namespace) -> None:
    """DELETE a finished job; its snapshot goes with the last job that used it."""
    api_client(args).request("DELETE", f"/api/v1/jobs/{args.id}")
    print(f"job {args.id} deleted")
