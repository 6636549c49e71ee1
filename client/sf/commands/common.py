"""Owns what every `sf` command shares: the --url/--token options, the API client from the
config, usage and server-side errors (`CliError`), which job a command means, and the output
helpers (JSON, values shown as text, times, rich's tables and console).

rich loads inside the helpers that draw with it, so a command that prints plain lines stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn


class CliError(Exception):
    """A failure the user should read as one `error: ...` line (exit 1)."""


def common_options() -> argparse.ArgumentParser:
    """The options every command takes, before or after its name: --url and --token."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS so a value given before the subcommand is not reset by the subparser default.
    common.add_argument("--url", default=argparse.SUPPRESS, help="server URL (overrides config)")
    common.add_argument("--token", default=argparse.SUPPRESS, help="API token (overrides config)")
    return common


def usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """A usage error of `parser`'s command: its usage, the message, exit 2."""
    parser.error(message)  # prints usage and exits 2


def api_client(args: argparse.Namespace) -> Any:
    """The server's client, from the options, SF_URL/SF_TOKEN or the config file."""
    from sf import config
    from sf.http import Client

    try:
        cfg = config.load(getattr(args, "url", None), getattr(args, "token", None))
    except config.ConfigError as exc:
        raise CliError(str(exc)) from exc
    if not cfg.url or not cfg.token:
        raise CliError(
            "not logged in: run `sf login --url URL --token TOKEN` (or set SF_URL and SF_TOKEN)"
        )
    try:
        return Client(cfg.url, cfg.token)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def display(value: Any) -> str:
    """A value as a table cell or a line shows it: a name for an object, "-" for nothing."""
    if isinstance(value, dict):
        return str(value.get("name") or value.get("username") or value.get("id") or "-")
    return "-" if value in (None, "") else str(value)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _latest_job_id(client: Any) -> str:
    page = client.request("GET", "/api/v1/jobs", query={"mine": "true", "limit": 1})
    items = page.get("items", []) if isinstance(page, dict) else page
    if not items:
        raise CliError("you have no jobs yet; submit one with `sf submit -- CMD`")
    return str(items[0]["id"])


def job_id(client: Any, args: argparse.Namespace) -> str:
    """The job the command names, else my latest."""
    return str(args.id) if args.id else _latest_job_id(client)


def when(value: Any, empty: str = "-") -> str:
    """An API time to the minute, as `YYYY-MM-DD HH:MM`; `empty` when there is none."""
    return str(value)[:16].replace("T", " ") if value else empty


def rich_console() -> Any:
    """rich's console; piped, 200 columns wide (no terminal width to fit: columns stay whole)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def rich_table(**options: Any) -> Any:
    """The CLI's tables: no box, bold headers, flush left."""
    from rich.table import Table

    return Table(box=None, header_style="bold", pad_edge=False, **options)


def duration_option(text: str) -> int:
    """An option's duration (90m, 4h, 1d12h, 36:00:00) in whole seconds, at least one."""
    from sf.project import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds < 1:
        raise argparse.ArgumentTypeError("must be at least one second")
    return seconds
