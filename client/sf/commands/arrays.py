"""Owns job arrays on the command line: the array part of `sf submit` (--array, the
--array-file read and checked line by line), and an array named `aN` wherever `sf job` takes an
id (its status, its tasks acted on together, its row in `sf job list`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sf.commands.common import display, print_json, usage_error


def array_fields(args: argparse.Namespace) -> dict:
    """The array part of a submission ({} for one job); the array file is read here, so a
    malformed line is named by its number before anything is uploaded."""
    if args.array is not None and args.array_file is not None:
        usage_error(args.parser, "give the tasks as --array SPEC or as --array-file PATH, not both")
    if args.array is None and args.array_file is None:
        if args.max_parallel is not None:
            usage_error(args.parser, "--max-parallel goes with --array or --array-file")
        return {}
    if args.max_parallel is not None and args.max_parallel < 1:
        usage_error(args.parser, "--max-parallel must be >= 1")
    fields: dict = {"max_parallel": args.max_parallel}
    if args.array is not None:
        return {**fields, "array": args.array}
    return {**fields, "array_params": _read_array_file(args.parser, args.array_file)}


def _read_array_file(parser: argparse.ArgumentParser, path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        usage_error(parser, f"--array-file {path}: cannot read it ({exc})")
    params = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue  # blank lines make no task
        try:
            value = json.loads(line)
        except ValueError as exc:
            usage_error(parser, f"--array-file {path}, line {number}: not JSON ({exc})")
        if not isinstance(value, dict):
            usage_error(parser, f"--array-file {path}, line {number}: not a JSON object")
        params.append(value)
    if not params:
        usage_error(parser, f"--array-file {path} has no parameter sets (one JSON object per line)")
    return params


def submit_array(client: Any, args: argparse.Namespace, payload: dict) -> None:
    """POST the array (its tasks made by the server) and say what was made."""
    made = client.request("POST", "/api/v1/arrays", json_body=payload)
    if args.json:
        print_json(made)
        return
    cap = f", at most {made['max_parallel']} at once" if made.get("max_parallel") else ""
    print(f"submitted array a{made['id']}: {made['size']} tasks{cap} ({made['summary']})")
    print(f"follow it: sf job status a{made['id']}")


def array_id(value: Any) -> int | None:
    """N of an "aN" id (an array's), else None."""
    text = str(value or "")
    return int(text[1:]) if text[:1] == "a" and text[1:].isdigit() else None


def show_array(client: Any, args: argparse.Namespace, array: int) -> None:
    """An array's fields and its tasks, one line each (index, job id, status, latest metric
    values, parameters)."""
    shown = client.request("GET", f"/api/v1/arrays/{array}")
    if args.json:
        print_json(shown)
        return
    cap = shown.get("max_parallel")
    fields = [
        ("array", f"a{shown['id']}"),
        ("name", shown.get("name")),
        ("team", shown.get("team")),
        ("user", shown.get("user")),
        ("tasks", f"{shown['size']} (indices {shown.get('spec')})"),
        ("max parallel", cap if cap else "no cap"),
        ("progress", shown.get("summary")),
    ]
    lines = [f"{label + ':':<15} {display(value)}" for label, value in fields]
    names = shown.get("metrics") or []
    for task in shown.get("tasks") or []:
        latest = task.get("latest") or {}
        values = " ".join(f"{n}={latest[n]:.4g}" for n in names if n in latest)
        params = json.dumps(task["params"], sort_keys=True) if task.get("params") else ""
        line = f"  [{task['index']}] job {task['id']} {task['status']}"
        lines.append(" ".join(part for part in (line, values, params) if part))
    sys.stdout.write("\n".join(lines) + "\n")


def act_on_array(client: Any, args: argparse.Namespace, array: int) -> None:
    """Apply the verb to every task of the array it applies to (retry --failed: the FAILED)."""
    body = {"failed": bool(getattr(args, "failed", False))}
    done = client.request("POST", f"/api/v1/arrays/{array}/{args.verb}", json_body=body)
    if args.json:
        print_json(done)
        return
    counts = ", ".join(f"{n} {state}" for state, n in (done.get("counts") or {}).items())
    print(
        f"array a{array} {args.verb}: {done['acted']} task(s) moved, {done['left']} left as "
        f"they were; now {counts or 'no tasks'}"
    )


def array_row(array: dict) -> dict:
    """An array as one row of `sf job list`: its summary as the status, its counts kept."""
    cap = array.get("max_parallel")
    return {
        "id": f"a{array['id']}",
        "name": array.get("name"),
        "status": array.get("summary"),
        "counts": array.get("counts") or {},
        "total_gpus": None,
        "attempt": None,
        "team": array.get("team"),
        "user": array.get("user"),
        "submitted_at": array.get("created_at"),
        "status_reason": f"array of {array.get('size')} tasks"
        + (f", at most {cap} at once" if cap else ""),
    }
