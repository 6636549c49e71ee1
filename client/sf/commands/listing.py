"""Owns `sf job list`: my jobs (or my teams') as a table, each array one row with its counts
unless --tasks, or as JSON; with --watch the table is fetched and drawn again until Ctrl-C."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from sf.commands.arrays import array_row
from sf.commands.common import (
    api_client,
    display,
    print_json,
    rich_console,
    rich_table,
    usage_error,
)

WATCH_DEFAULT_S, WATCH_MIN_S = 2.0, 0.5  # `sf job list --watch`: between redraws


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    p = verbs.add_parser("list", parents=[common], help="list jobs (default: mine)")
    p.add_argument("--status", help="only jobs in this status")
    p.add_argument("--team", help="only jobs of this team")
    p.add_argument("--user", help="only jobs of this user")
    p.add_argument("--all", action="store_true", help="every job of my teams, not only mine")
    p.add_argument("--limit", type=int, default=20, help="at most N jobs (default 20)")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--tasks",
        action="store_true",
        help="list an array's tasks one by one (default: one row per array, with its counts)",
    )
    p.add_argument("--watch", action="store_true", help="redraw the table until Ctrl-C")
    p.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help=f"with --watch: seconds between redraws (default {WATCH_DEFAULT_S:g}, "
        f"at least {WATCH_MIN_S:g})",
    )
    p.set_defaults(handler=cmd_list, parser=p)


def cmd_list(args: argparse.Namespace) -> None:
    """List jobs as a rich table (or JSON); --watch redraws the table until Ctrl-C."""
    if args.watch or args.interval is not None:
        _watch_list(args)
        return
    client = api_client(args)
    if args.json:  # the jobs as the API has them, every task of an array too
        print_json(_list_items(client, args))
        return
    _print_table(_table_items(client, args))


def _list_items(client: Any, args: argparse.Namespace, tasks: bool = True) -> list[dict]:
    query = {"status": args.status, "team": args.team, "user": args.user, "limit": args.limit}
    if not args.all:
        query["mine"] = "true"
    if not tasks:
        query["tasks"] = "false"
    page = client.request("GET", "/api/v1/jobs", query=query)
    return page.get("items", []) if isinstance(page, dict) else page


def _table_items(client: Any, args: argparse.Namespace) -> list[dict]:
    """The table's rows: jobs, and each array as one row with its counts per state (its
    tasks one by one with --tasks), newest first."""
    if args.tasks:
        return _list_items(client, args)
    jobs = _list_items(client, args, tasks=False)
    query = {"team": args.team, "user": args.user, "limit": args.limit}
    if not args.all:
        query["mine"] = "true"
    rows = [array_row(a) for a in client.request("GET", "/api/v1/arrays", query=query)]
    if args.status:  # an array is listed while a task of it is in that status
        rows = [r for r in rows if args.status.upper() in r["counts"]]
    merged = sorted(jobs + rows, key=lambda r: str(r.get("submitted_at") or ""), reverse=True)
    return merged[: args.limit]


def _watch_list(args: argparse.Namespace) -> None:
    """Fetch and redraw the job table every --interval seconds until Ctrl-C, which is how a
    watch is left, so it exits 0. A terminal sees the table redrawn in place; anything else
    (a pipe, a log file) gets every table, a blank line after each, since there is no place."""
    if not args.watch:
        usage_error(args.parser, "--interval goes with --watch")
    if args.json:
        usage_error(
            args.parser, "--watch redraws a table for people; scripts poll `sf job list --json`"
        )
    interval = WATCH_DEFAULT_S if args.interval is None else args.interval
    if not WATCH_MIN_S <= interval < float("inf"):
        usage_error(
            args.parser, f"--interval must be a number of seconds, at least {WATCH_MIN_S:g}"
        )
    client = api_client(args)
    from rich.console import Console

    console = Console()
    try:
        if console.is_terminal:
            _watch_live(console, client, args, interval)
        else:
            _watch_lines(client, args, interval)
    except KeyboardInterrupt:
        return


def _watch_live(console: Any, client: Any, args: argparse.Namespace, interval: float) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    # No auto refresh: the view changes only when a fetch comes back. Not transient: the last
    # table stays on screen after Ctrl-C.
    with Live(console=console, auto_refresh=False) as live:
        while True:
            table = _jobs_table(_table_items(client, args))
            head = f"every {interval:g}s, last at {time.strftime('%H:%M:%S')}; Ctrl-C stops"
            live.update(Group(Text(head, style="dim"), table), refresh=True)
            time.sleep(interval)


def _watch_lines(client: Any, args: argparse.Namespace, interval: float) -> None:
    from rich.console import Console

    console = Console(width=200)  # as _print_table: no terminal width to fit
    while True:
        console.print(_jobs_table(_table_items(client, args)))
        console.print()
        sys.stdout.flush()  # a reader at the other end of a pipe sees each table at once
        time.sleep(interval)


def _print_table(items: list[dict]) -> None:
    rich_console().print(_jobs_table(items))  # piped: 200 columns, no terminal width to fit


def _jobs_table(items: list[dict]) -> Any:
    table = rich_table()
    for col in ("ID", "NAME", "STATUS", "POS", "GPUS", "ATTEMPT", "TEAM", "USER", "SUBMITTED"):
        # Only the free-text columns may shrink; ids and states must stay readable.
        shrinks = col == "NAME"
        table.add_column(
            col,
            no_wrap=True,
            overflow="ellipsis" if shrinks else "fold",
            max_width=32 if shrinks else None,
            min_width=None if shrinks else len(col) + 1,
        )
    table.add_column("REASON", no_wrap=True, max_width=48, overflow="ellipsis")
    for job in items:
        submitted = str(job.get("submitted_at") or "-")[:16].replace("T", " ")
        row = [
            job.get(k) for k in ("id", "name", "status", "queue_position", "total_gpus", "attempt")
        ]
        row += [job.get("team"), job.get("user")]
        reason = display(job.get("status_reason")).split("\n")[0]
        table.add_row(*map(display, row), submitted, reason)
    return table
