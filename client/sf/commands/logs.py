"""Owns `sf job logs`: a job's lines replayed (the last N, or all) and followed through the
server's long poll until the job is done, as text (stderr's lines to stderr, a multi-node job's
marked with their rank) or as JSON objects."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from sf.commands.common import api_client, job_id, usage_error

LOG_TAIL_DEFAULT = 50
LOG_WAIT_S = 20
LOG_POLL_MAX_S = 5.0  # the longest pause between follows a server's poll_after_s gets
# The largest page the server serves by default (settings.SF_LOG_PAGE_MAX_LINES, which this
# mirrors: tests/client/test_mirrors.py): `sf logs` reads a long log in the fewest requests.
LOG_PAGE_LINES = 50_000


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    p = verbs.add_parser("logs", parents=[common], help="print and follow a job's output")
    p.add_argument("id", nargs="?", help="job id (default: your latest job)")
    p.add_argument(
        "-n",
        type=int,
        default=None,
        metavar="N",
        help=f"last N lines then follow (default {LOG_TAIL_DEFAULT}; 0 = everything)",
    )
    p.add_argument("--no-follow", action="store_true", help="print what exists and exit")
    p.add_argument(
        "--rank",
        type=int,
        metavar="N",
        help="only rank N's lines (a multi-node job; without it each line is marked [rank N])",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(handler=cmd_logs, parser=p)


def cmd_logs(args: argparse.Namespace) -> None:
    """Replay and optionally follow a job's log lines until the server reports `done`."""
    client = api_client(args)
    path = f"/api/v1/jobs/{job_id(client, args)}/logs"
    tail = LOG_TAIL_DEFAULT if args.n is None else args.n
    if tail < 0:
        usage_error(args.parser, "-n must be >= 0")
    if args.rank is not None and args.rank < 0:
        usage_error(args.parser, "--rank must be >= 0")
    # First page: tail=N for the last N lines; no tail means history from the first line.
    # Following is a long poll: the server holds an empty answer up to LOG_WAIT_S for new lines,
    # or (a server whose workers must not be held) answers at once with when to ask again.
    # The server picks one rank's lines: its cursor still moves past the other ranks' ones.
    follow = {} if args.no_follow else {"follow": "true", "wait": LOG_WAIT_S, "poll": "true"}
    each = {"limit": LOG_PAGE_LINES, "rank": args.rank, **follow}
    query: dict = {"tail": tail or None, **each}
    while True:
        page = client.request("GET", path, query=query)
        lines = page.get("lines", [])
        if args.json:
            _json_writer(lines)
        else:
            _text_writer(lines, marked=args.rank is None)
        if page.get("done") or (args.no_follow and not lines):
            return
        query = {"cursor": page.get("cursor"), **each}
        pause = page.get("poll_after_s")
        if not lines and isinstance(pause, int | float) and pause > 0:
            time.sleep(min(float(pause), LOG_POLL_MAX_S))


def _text_writer(lines: list[dict], marked: bool) -> None:
    # One join + one write per page: per-line writes make a 1M-line replay take many seconds.
    # A multi-node job's lines carry their rank: marked, as the runner's own echo marks them.
    text = _ranked_text if marked else _plain_text
    out = [text(ln) for ln in lines if ln.get("stream") != "stderr"]
    err = [text(ln) for ln in lines if ln.get("stream") == "stderr"]
    if out:
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()
    if err:
        sys.stderr.write("\n".join(err) + "\n")
        sys.stderr.flush()


def _ranked_text(line: dict) -> str:
    return f"[rank {line['rank']}] {line['text']}" if "rank" in line else line["text"]


def _plain_text(line: dict) -> str:
    return line["text"]


def _json_writer(lines: list[dict]) -> None:
    if lines:
        dumps: Callable[[Any], str] = json.dumps
        sys.stdout.write("".join(dumps(ln) + "\n" for ln in lines))
        sys.stdout.flush()
