"""Owns `sf usage`: my teams' GPU-hours and their cost per team, user, cluster, GPU type or UTC
day, with the total; `sf usage export`: the accounting export, one sacct-shaped record per
attempt."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any

from sf.commands.common import api_client, display, print_json, rich_console, rich_table


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("usage", parents=[common], help="GPU-hours of my teams (UTC days)")
    p.add_argument(
        "what", nargs="?", choices=["export"], help="export: one sacct-shaped record per attempt"
    )
    p.add_argument("--start", help="export: from (UTC, YYYY-MM-DD or ISO 8601; default 1st)")
    p.add_argument("--end", help="export: until, excluded (default: now)")
    p.add_argument("--format", choices=["csv", "json"], default="csv", help="export: csv or json")
    p.add_argument("--team", help="one team (default: every team of mine)")
    p.add_argument("--since", metavar="YYYY-MM-DD", help="first day (default: 1st of this month)")
    p.add_argument("--until", metavar="YYYY-MM-DD", help="day after the last (default: tomorrow)")
    p.add_argument("--by", choices=["team", "user", "cluster", "gpu_type", "day"], default="team")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_usage, parser=p)


def cmd_usage(args: argparse.Namespace) -> None:
    """GET /api/v1/usage and print one row per team, user, cluster, GPU type or day, and the
    total."""
    if args.what == "export":
        cmd_export(args)
        return
    query = {"team": args.team, "since": args.since, "until": args.until, "by": args.by}
    answer = api_client(args).request("GET", "/api/v1/usage", query=query)
    if args.json:
        print_json(answer)
        return

    table = rich_table(show_footer=True)
    table.add_column(args.by.upper(), "TOTAL", no_wrap=True)
    table.add_column("GPU-HOURS", f"{answer['total_gpu_hours']:,.2f}", justify="right")
    table.add_column("GPU-SECONDS", f"{answer['total_gpu_seconds']:,.0f}", justify="right")
    borrowed = sum(row.get("borrowed_gpu_hours", 0) for row in answer["rows"])
    table.add_column("BORROWED GPU-HOURS", f"{borrowed:,.2f}", justify="right")
    currency = answer.get("currency")  # a server with cost (issue 50)
    if currency:
        table.add_column(f"COST ({currency})", display(answer.get("total_cost")), justify="right")
    for row in answer["rows"]:
        cells = [
            # jobs that asked for no GPU type: "" in the answer
            "any type"
            if args.by == "gpu_type" and not row.get(args.by)
            else display(row.get(args.by)),
            f"{row['gpu_hours']:,.2f}",
            f"{row['gpu_seconds']:,.0f}",
            f"{row.get('borrowed_gpu_hours', 0):,.2f}",
        ]
        table.add_row(*cells, *([display(row.get("cost"))] if currency else []))
    console = rich_console()
    console.print(f"GPU usage {answer['since']} to {answer['until']} (UTC, until excluded)")
    console.print(table)


def cmd_export(args: argparse.Namespace) -> None:
    """GET /api/v1/usage/export: the CSV as the server wrote it, or its JSON."""
    query = {"start": args.start, "end": args.end, "format": args.format}
    if args.format == "json":
        print_json(api_client(args).request("GET", "/api/v1/usage/export", query=query))
        return
    given = urllib.parse.urlencode({k: v for k, v in query.items() if v})
    api_client(args).download(f"/api/v1/usage/export?{given}", sys.stdout.buffer)
    sys.stdout.buffer.flush()
