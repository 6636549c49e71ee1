"""Owns `sf job attempts ID`: each attempt of a job with its engine id (a Slurm job id, a pod,
a Ray job), the engine's final state, the engine's own start and end beside the billed ones,
the billed GPU-seconds (metering's figure, as the API gives it) and its cause; `--json` gives
the API's answer as it is."""

from __future__ import annotations

import argparse
from typing import Any

from sf.commands.common import api_client, display, job_id, print_json, rich_console, rich_table


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    p = verbs.add_parser(
        "attempts", parents=[common], help="a job's attempts: engine ids, engine and billed times"
    )
    p.add_argument("id", nargs="?", help="job id (default: your latest job)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_attempts, parser=p)


def cmd_attempts(args: argparse.Namespace) -> None:
    """GET /api/v1/jobs/ID/attempts and print one row per attempt."""
    client = api_client(args)
    answer = client.request("GET", f"/api/v1/jobs/{job_id(client, args)}/attempts")
    if args.json:
        print_json(answer)
        return
    table = rich_table()
    for name, justify in COLUMNS:
        table.add_column(name, justify=justify, no_wrap=name != "CAUSE")
    for attempt in answer:
        table.add_row(*row(attempt))
    rich_console().print(table)


COLUMNS = (
    ("#", "right"),
    ("ENGINE ID", "left"),
    ("STATE", "left"),
    ("ENGINE START", "left"),
    ("ENGINE END", "left"),
    ("BILLED START", "left"),
    ("BILLED END", "left"),
    ("GPUS", "right"),
    ("GPU-SECONDS", "right"),
    ("CAUSE", "left"),
)


def row(attempt: dict) -> list[str]:
    """One attempt's cells; times to the second in UTC, as the API writes them."""
    cause = attempt.get("failure") or ""
    reason = attempt.get("end_reason") or ""
    return [
        str(attempt["number"]),
        display(attempt.get("job_ref")),
        display(attempt.get("native_state")),
        _second(attempt.get("engine_start")),
        _second(attempt.get("engine_end")),
        _second(attempt.get("start_time")),
        _second(attempt.get("end_time")),
        str(attempt.get("total_gpus", 0)),
        f"{attempt.get('gpu_seconds', 0.0):,.3f}",
        display(f"{cause}: {reason}" if cause and reason else cause or reason),
    ]


def _second(value: Any) -> str:
    """An API time as `YYYY-MM-DD HH:MM:SS.ffffff` cut to what it holds; "-" for none."""
    return str(value).replace("T", " ").removesuffix("Z").split("+")[0] if value else "-"
