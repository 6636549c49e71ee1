"""Owns the `sf` command line: argument parsing, command handlers and exit codes.

Exit codes: 0 ok, 1 server/config error, 2 usage error, 3 server unreachable.
Only argparse/json/os/sys load at start-up; HTTP, snapshot and rich load inside commands
so `sf --help` and `sf job status` stay fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from sf import __version__

EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3
LOG_TAIL_DEFAULT = 50
LOG_WAIT_S = 20
LOG_POLL_MAX_S = 5.0  # the longest pause between follows a server's poll_after_s gets
LOG_PAGE_LINES = 50_000
WATCH_DEFAULT_S, WATCH_MIN_S = 2.0, 0.5  # `sf job list --watch`: between redraws


class CliError(Exception):
    """A failure the user should read as one `error: ...` line (exit 1)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `sf` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, command = _split_command(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command = command
    if getattr(args, "handler", None) is None:
        # `sf` or `sf job` alone: show the relevant help instead of a bare error.
        getattr(args, "parser", parser).print_help(sys.stderr)
        return EXIT_USAGE
    if command is not None and args.handler is not cmd_submit:
        args.parser.error("only `sf submit` takes a command after --")
    return _run(args)


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    # The job command may contain anything argparse would try to interpret, so cut it off first.
    if "--" in argv:
        idx = argv.index("--")
        return argv[:idx], argv[idx + 1 :]
    return argv, None


def _run(args: argparse.Namespace) -> int:
    from sf.http import ApiError, ConnectError

    try:
        args.handler(args)
        return 0
    except ApiError as exc:
        return _fail(exc.detail, EXIT_ERROR)
    except ConnectError as exc:
        return _fail(str(exc), EXIT_UNREACHABLE)
    except CliError as exc:
        return _fail(str(exc), EXIT_ERROR)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Reader went away (e.g. `| head`); silence the flush error at interpreter exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"error: {message}\n")
    return code


# --- parser ---------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS so a value given before the subcommand is not reset by the subparser default.
    common.add_argument("--url", default=argparse.SUPPRESS, help="server URL (overrides config)")
    common.add_argument("--token", default=argparse.SUPPRESS, help="API token (overrides config)")
    return common


def build_parser() -> argparse.ArgumentParser:
    """Build the full argparse tree for `sf`."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog="sf", parents=[common], description="Starforge GPU job platform client."
    )
    parser.add_argument("--version", action="version", version=f"sf {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    login = sub.add_parser("login", parents=[common], help="verify a token and save it")
    login.set_defaults(handler=cmd_login, parser=login)
    _add_submit(sub, common)
    _add_job(sub, common)
    _add_token(sub, common)
    _add_usage(sub, common)
    _add_notify(sub, common)
    _add_team(sub, common)
    _add_completion(sub)
    return parser


def _add_submit(sub: Any, common: argparse.ArgumentParser) -> None:
    # The job's options default to None, "not given": the [job] table of the directory's
    # starforge.toml fills those (sf.project), and the defaults in the help apply after it.
    p = sub.add_parser(
        "submit",
        parents=[common],
        help="snapshot this directory and submit a job",
        usage="sf submit [options] [-- CMD [ARGS...]]",
        description="Snapshot the directory and submit a job. Without a command after --, "
        "the job runs the entrypoint of the [job] table of the directory's starforge.toml; "
        "that table's keys (entrypoint, nodes, gpus, gpu_type, cpus, memory, image, env, "
        "cluster, team, name, priority, window, window_policy, pending_deadline_s, "
        "time_limit, max_retries, retry_cooldown_s, then) are the defaults the options "
        "override.",
    )
    p.add_argument(
        "--nodes", type=int, metavar="N", help="nodes, one rank each, started together (default 1)"
    )
    p.add_argument("--gpus", type=int, metavar="N", help="GPUs per node (default 1, >= 0)")
    p.add_argument(
        "--gpu-type", metavar="TYPE", help="GPU type every node must have, e.g. a100 (default: any)"
    )
    p.add_argument("--cpus", type=int, metavar="N", help="CPUs per node (default: the cluster's)")
    p.add_argument("--memory", metavar="SIZE", help="memory per node, e.g. 64G, 512M or 1.5T")
    p.add_argument("--image", metavar="REPO:TAG", help="container image (Kubernetes clusters)")
    p.add_argument("--cluster", help="cluster to run on (default: server's choice)")
    p.add_argument("--team", help="team to charge (default: your default team)")
    p.add_argument("--name", help="human-readable job name")
    p.add_argument("--priority", type=int, help="scheduling priority (default 0)")
    p.add_argument("--window", help="named scheduling window")
    p.add_argument(
        "--window-policy",
        choices=["wait", "pause"],
        help="wait: start only inside the window (default); pause: also pause the job when "
        "the window closes and resume it when it reopens",
    )
    p.add_argument("--env", action="extend", nargs="+", default=[], metavar="K=V")
    p.add_argument(
        "--pending-deadline",
        type=int,
        metavar="SECONDS",
        help="give up if not started within SECONDS",
    )
    p.add_argument(
        "--time-limit",
        type=_duration_option,
        metavar="DURATION",
        help="stop the job once it has run this long, e.g. 90m, 4h, 1d12h or 36:00:00; "
        "never retried automatically (default: the team's)",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        metavar="N",
        help="retry automatically up to N times after a retryable failure (default: team's)",
    )
    p.add_argument(
        "--retry-cooldown",
        type=int,
        metavar="SECONDS",
        help="wait before the first automatic retry; doubles each retry (default: team's)",
    )
    p.add_argument(
        "--then",
        action="append",
        metavar="NAME",
        help="after success, run the follow-on job [then.NAME] of starforge.toml (repeatable)",
    )
    p.add_argument(
        "--max-snapshot-mb",
        type=float,
        metavar="N",
        help="snapshot size cap in MiB (default $SF_MAX_SNAPSHOT_MB or 100)",
    )
    p.add_argument(
        "--array",
        metavar="SPEC",
        help="a job array: one task per index, e.g. 0-31, 0-31:4 or 1,3,5; {index} in the "
        "command becomes the task's index (SF_ARRAY_INDEX)",
    )
    p.add_argument(
        "--array-file",
        metavar="PATH",
        help="a job array: one task per line of PATH, each a JSON object of parameters; "
        "{NAME} in the command becomes the task's NAME (all of them: SF_ARRAY_PARAMS)",
    )
    p.add_argument(
        "--max-parallel",
        type=int,
        metavar="N",
        help="with --array or --array-file: at most N tasks active at once",
    )
    p.add_argument("--dir", default=".", help="directory to snapshot (default .)")
    p.add_argument("--json", action="store_true", help="print the created job as JSON")
    p.add_argument("stray", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(handler=cmd_submit, parser=p)


def _add_job(sub: Any, common: argparse.ArgumentParser) -> None:
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
    _add_list(verbs, common)
    _add_logs(verbs, common)
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


def _add_list(verbs: Any, common: argparse.ArgumentParser) -> None:
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


def _add_logs(verbs: Any, common: argparse.ArgumentParser) -> None:
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


def _add_token(sub: Any, common: argparse.ArgumentParser) -> None:
    token = sub.add_parser("token", parents=[common], help="create, list and revoke API tokens")
    verbs = token.add_subparsers(title="token commands", metavar="VERB")
    create = verbs.add_parser("create", parents=[common], help="create a token (shown once)")
    create.add_argument("--name", default="cli", help="what the token is for (default cli)")
    create.add_argument(
        "--expires-in-days", type=int, metavar="D", help="expire after D days (default: never)"
    )
    create.add_argument("--json", action="store_true")
    create.set_defaults(handler=cmd_token_create, parser=create)
    listing = verbs.add_parser("list", parents=[common], help="list my tokens")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=cmd_token_list, parser=listing)
    revoke = verbs.add_parser("revoke", parents=[common], help="revoke a token")
    revoke.add_argument("id", type=int, help="token id (see `sf token list`)")
    revoke.set_defaults(handler=cmd_token_revoke, parser=revoke)
    token.set_defaults(handler=None, parser=token)


def _add_usage(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("usage", parents=[common], help="GPU-hours of my teams (UTC days)")
    p.add_argument("--team", help="one team (default: every team of mine)")
    p.add_argument("--since", metavar="YYYY-MM-DD", help="first day (default: 1st of this month)")
    p.add_argument("--until", metavar="YYYY-MM-DD", help="day after the last (default: tomorrow)")
    p.add_argument("--by", choices=["team", "user", "cluster", "day"], default="team")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_usage, parser=p)


# For the help only: the server's list is the one that counts, and it names an unknown event.
NOTIFY_EVENTS = ("succeeded", "failed", "stopped", "preempted", "waiting-too-long")


def _add_notify(sub: Any, common: argparse.ArgumentParser) -> None:
    notify = sub.add_parser(
        "notify", parents=[common], help="webhooks: be told when jobs end, fail or wait too long"
    )
    verbs = notify.add_subparsers(title="notify commands", metavar="VERB")
    add = verbs.add_parser(
        "add",
        parents=[common],
        help="add a webhook",
        description="Add a webhook: the server POSTs a signed JSON body to URL when one of "
        "the events happens to my jobs (or, for a team admin, to every job of --team). A Slack "
        "incoming-webhook URL gets Slack's text instead; mailto:ADDRESS gets an email.",
    )
    # Not dest "url": that is --url, the server's (`_common`).
    add.add_argument("target", metavar="URL", help="http(s) URL to POST to, or mailto:ADDRESS")
    add.add_argument(
        "--on",
        required=True,
        type=_events_option,
        metavar="EVENTS",
        help=f"comma separated, of: {', '.join(NOTIFY_EVENTS)}",
    )
    add.add_argument("--team", help="every job of this team, for its admins (default: my jobs)")
    add.add_argument(
        "--wait",
        type=_duration_option,
        metavar="DURATION",
        help="waiting-too-long: once a job has been QUEUED this long, e.g. 30m, 2h or 1d "
        "(default: the server's, 1h)",
    )
    add.add_argument("--json", action="store_true", help="print the created webhook as JSON")
    add.set_defaults(handler=cmd_notify_add, parser=add)
    listing = verbs.add_parser("list", parents=[common], help="list my (and my teams') webhooks")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=cmd_notify_list, parser=listing)
    show = verbs.add_parser(
        "show", parents=[common], help="one webhook, its secret and latest deliveries"
    )
    show.add_argument("id", type=int, help="webhook id (see `sf notify list`)")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_notify_show, parser=show)
    remove = verbs.add_parser("remove", parents=[common], help="remove a webhook and its log")
    remove.add_argument("id", type=int, help="webhook id (see `sf notify list`)")
    remove.set_defaults(handler=cmd_notify_remove, parser=remove)
    test = verbs.add_parser("test", parents=[common], help="send a test delivery now")
    test.add_argument("id", type=int, help="webhook id (see `sf notify list`)")
    test.add_argument("--json", action="store_true")
    test.set_defaults(handler=cmd_notify_test, parser=test)
    notify.set_defaults(handler=None, parser=notify)


def _events_option(text: str) -> list[str]:
    # Names are the server's to check: it answers an unknown one with the list to pick from.
    return [event.strip() for event in text.split(",") if event.strip()]


# The API's roles (jobs/api/teams.py); choices here so a typo is caught, and completed, locally.
TEAM_ROLES = ("member", "viewer", "admin")


def _add_team(sub: Any, common: argparse.ArgumentParser) -> None:
    team = sub.add_parser("team", parents=[common], help="my teams, their quotas and members")
    verbs = team.add_subparsers(title="team commands", metavar="VERB")
    listing = verbs.add_parser("list", parents=[common], help="list my teams (staff: every team)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=cmd_team_list, parser=listing)
    show = verbs.add_parser(
        "show", parents=[common], help="one team: its quotas, defaults and members"
    )
    show.add_argument("name", metavar="TEAM")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_team_show, parser=show)
    add = verbs.add_parser("add-member", parents=[common], help="add a user (team admins)")
    add.add_argument("name", metavar="TEAM")
    add.add_argument("username", metavar="USER")
    add.add_argument("--role", choices=TEAM_ROLES, default="member", help="default member")
    add.set_defaults(handler=cmd_team_add_member, parser=add)
    remove = verbs.add_parser("remove-member", parents=[common], help="remove a member (admins)")
    remove.add_argument("name", metavar="TEAM")
    remove.add_argument("username", metavar="USER")
    remove.set_defaults(handler=cmd_team_remove_member, parser=remove)
    role = verbs.add_parser("set-role", parents=[common], help="change a member's role (admins)")
    role.add_argument("name", metavar="TEAM")
    role.add_argument("username", metavar="USER")
    role.add_argument("role", metavar="ROLE", choices=TEAM_ROLES, help=", ".join(TEAM_ROLES))
    role.set_defaults(handler=cmd_team_set_role, parser=role)
    team.set_defaults(handler=None, parser=team)


def _add_completion(sub: Any) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for bash or zsh, made from this sf's own "
        'commands. Load it with: source <(sf completion bash), or eval "$(sf completion zsh)" '
        "in ~/.zshrc.",
    )
    p.add_argument("shell", metavar="SHELL", choices=("bash", "zsh"), help="bash or zsh")
    p.set_defaults(handler=cmd_completion, parser=p)


def _usage(parser: argparse.ArgumentParser, message: str) -> None:
    parser.error(message)  # prints usage and exits 2


# --- helpers ---------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Any:
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


def _name(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("name") or value.get("username") or value.get("id") or "-")
    return "-" if value in (None, "") else str(value)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _latest_job_id(client: Any) -> str:
    page = client.request("GET", "/api/v1/jobs", query={"mine": "true", "limit": 1})
    items = page.get("items", []) if isinstance(page, dict) else page
    if not items:
        raise CliError("you have no jobs yet; submit one with `sf submit -- CMD`")
    return str(items[0]["id"])


def _job_id(client: Any, args: argparse.Namespace) -> str:
    return str(args.id) if args.id else _latest_job_id(client)


# --- commands --------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> None:
    """Verify URL+token against /api/v1/me and save them to the config file."""
    from sf import config
    from sf.http import Client

    url = getattr(args, "url", None) or os.environ.get("SF_URL")
    token = getattr(args, "token", None) or os.environ.get("SF_TOKEN")
    if not url or not token:
        _usage(args.parser, "login needs --url URL and --token TOKEN")
    try:
        me = Client(url, token).request("GET", "/api/v1/me")
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    config.save(url, token)
    teams = ", ".join(_name(t) for t in me.get("teams", [])) or "none"
    print(f"logged in to {url} as {_name(me.get('username') or me.get('user'))} (teams: {teams})")


def cmd_submit(args: argparse.Namespace) -> None:
    """Snapshot the directory, upload it, and create the job."""
    payload = _submit_payload(args)
    array = _array_fields(args)  # checked before the snapshot is made and uploaded
    client = _client(args)
    # Snapshots belong to teams: upload for the team the job is submitted to.
    payload["team"] = payload["team"] or _default_team(client)
    payload["snapshot"] = _upload_snapshot(client, args, payload["team"])
    if array:
        _submit_array(client, args, {**payload, **array})
        return
    job = client.request("POST", "/api/v1/jobs", json_body=payload)
    if args.json:
        _print_json(job)
        return
    print(f"submitted job {job['id']} run_id {job.get('run_id', '-')} ({job.get('status', '-')})")
    print(f"follow it: sf job logs {job['id']}")


def _array_fields(args: argparse.Namespace) -> dict:
    """The array part of a submission ({} for one job); the array file is read here, so a
    malformed line is named by its number before anything is uploaded."""
    if args.array is not None and args.array_file is not None:
        _usage(args.parser, "give the tasks as --array SPEC or as --array-file PATH, not both")
    if args.array is None and args.array_file is None:
        if args.max_parallel is not None:
            _usage(args.parser, "--max-parallel goes with --array or --array-file")
        return {}
    if args.max_parallel is not None and args.max_parallel < 1:
        _usage(args.parser, "--max-parallel must be >= 1")
    fields: dict = {"max_parallel": args.max_parallel}
    if args.array is not None:
        return {**fields, "array": args.array}
    return {**fields, "array_params": _read_array_file(args.parser, args.array_file)}


def _read_array_file(parser: argparse.ArgumentParser, path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        _usage(parser, f"--array-file {path}: cannot read it ({exc})")
    params = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue  # blank lines make no task
        try:
            value = json.loads(line)
        except ValueError as exc:
            _usage(parser, f"--array-file {path}, line {number}: not JSON ({exc})")
        if not isinstance(value, dict):
            _usage(parser, f"--array-file {path}, line {number}: not a JSON object")
        params.append(value)
    if not params:
        _usage(parser, f"--array-file {path} has no parameter sets (one JSON object per line)")
    return params


def _submit_array(client: Any, args: argparse.Namespace, payload: dict) -> None:
    made = client.request("POST", "/api/v1/arrays", json_body=payload)
    if args.json:
        _print_json(made)
        return
    cap = f", at most {made['max_parallel']} at once" if made.get("max_parallel") else ""
    print(f"submitted array a{made['id']}: {made['size']} tasks{cap} ({made['summary']})")
    print(f"follow it: sf job status a{made['id']}")


# The option that sets a field of [job] (sf.project.KEYS), where it is not the field's name.
OPTION_OF = {"pending_deadline_s": "pending_deadline", "retry_cooldown_s": "retry_cooldown"}
# The API's field for a key of [job], where it is not the key's name.
FIELD_OF = {"time_limit": "time_limit_s"}
# What a field is when neither an option nor starforge.toml gives it (others: the server's).
SUBMIT_DEFAULTS = {"nodes": 1, "gpus": 1, "priority": 0, "window_policy": "wait", "then": []}


def _submit_payload(args: argparse.Namespace) -> dict:
    from sf.project import KEYS, ProjectError, job_defaults

    if args.stray:
        _usage(args.parser, "put the job command after --, e.g. sf submit -- python train.py")
    try:
        defaults = job_defaults(args.dir)
    except ProjectError as exc:
        _usage(args.parser, str(exc))
    command = args.command or defaults.get("entrypoint")
    if not command:
        _usage(
            args.parser,
            "missing command after --, e.g. sf submit -- python train.py"
            + (" (or an entrypoint in [job] of starforge.toml)" if defaults else ""),
        )
    if args.nodes is not None and args.nodes < 1:
        _usage(args.parser, "--nodes must be >= 1")
    if args.gpus is not None and args.gpus < 0:
        _usage(args.parser, "--gpus must be >= 0")
    if args.cpus is not None and args.cpus < 1:
        _usage(args.parser, "--cpus must be >= 1")
    if args.pending_deadline is not None and args.pending_deadline <= 0:
        _usage(args.parser, "--pending-deadline must be a positive number of seconds")
    if args.max_retries is not None and args.max_retries < 0:
        _usage(args.parser, "--max-retries must be >= 0")
    if args.retry_cooldown is not None and args.retry_cooldown < 0:
        _usage(args.parser, "--retry-cooldown must be >= 0 seconds")
    env = dict(defaults.get("env", {}))  # --env K=V replaces the file's K, keeps the rest
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _usage(args.parser, f"--env expects K=V, got {item!r}")
        env[key] = value
    payload = {"entrypoint": command, "snapshot": None, "env": env}
    for field in [f for f in KEYS if f not in payload]:
        given = getattr(args, OPTION_OF.get(field, field))
        value = defaults.get(field, SUBMIT_DEFAULTS.get(field)) if given is None else given
        payload[FIELD_OF.get(field, field)] = value
    return payload


def _duration_option(text: str) -> int:
    from sf.project import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds < 1:
        raise argparse.ArgumentTypeError("must be at least one second")
    return seconds


def _max_snapshot_mb(args: argparse.Namespace) -> float:
    from sf.snapshot import DEFAULT_MAX_MB

    if args.max_snapshot_mb is not None:
        value = args.max_snapshot_mb
    else:
        raw = os.environ.get("SF_MAX_SNAPSHOT_MB", "")
        try:
            value = float(raw) if raw else DEFAULT_MAX_MB
        except ValueError:
            _usage(args.parser, f"SF_MAX_SNAPSHOT_MB must be a number, got {raw!r}")
    if value <= 0:
        _usage(args.parser, "--max-snapshot-mb must be > 0")
    return value


def _default_team(client: Any) -> str | None:
    """The team the server submits to when none is named (the first of /me), if any."""
    me = client.request("GET", "/api/v1/me")
    team = me.get("default_team") if isinstance(me, dict) else None
    return team if isinstance(team, str) and team else None


def _upload_snapshot(client: Any, args: argparse.Namespace, team: str | None = None) -> str:
    from sf import snapshot

    try:
        snap = snapshot.build(args.dir, _max_snapshot_mb(args))
    except snapshot.SnapshotError as exc:
        raise CliError(str(exc)) from exc
    try:
        sys.stderr.write(
            f"snapshot {snap.sha256[:12]}: {snap.files} files, "
            f"{snap.raw_bytes / 1048576:.1f} MiB -> {snap.size / 1048576:.1f} MiB gzipped\n"
        )
        answer = _send(client, snap, team)
    finally:
        snap.close()
    server_sha = answer.get("sha256") if isinstance(answer, dict) else None
    if server_sha and server_sha != snap.sha256:
        raise CliError(f"server stored snapshot {server_sha}, expected {snap.sha256}")
    return snap.sha256


def _send(client: Any, snap: Any, team: str | None) -> Any:
    from urllib.parse import urlencode

    path = "/api/v1/snapshots" + (f"?{urlencode({'team': team})}" if team else "")
    with open(snap.path, "rb") as fh:
        if not sys.stderr.isatty():
            return client.upload(path, fh, snap.size, "application/gzip")
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

        columns = ("uploading", BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("upload", total=snap.size)
            return client.upload(
                path,
                fh,
                snap.size,
                "application/gzip",
                on_progress=lambda n: bar.advance(task, n),
            )


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
    "gpus",
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


STATUS_LABELS = {"memory_mb": "memory", "time_limit_s": "time limit"}
STATUS_IF_SET = ("cpus", "memory_mb", "image")  # what the job asked for, if it did


def cmd_status(args: argparse.Namespace) -> None:
    """Show one job as aligned `key: value` lines (or JSON); a multi-node job's ranks after."""
    client = _client(args)
    array = _array_id(args.id)
    if array is not None:
        _array_status(client, args, array)
        return
    job = client.request("GET", f"/api/v1/jobs/{_job_id(client, args)}")
    if args.json:
        _print_json(job)
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
            f"{'preempted:':<15} at {_when(job['preempted_at'])[11:]} UTC, SIGKILL at "
            f"{_when(job.get('preempt_kill_at'))[11:]} UTC unless it exits first"
        )
    if (job.get("nodes") or 1) > 1:
        lines += ["ranks:", *_rank_table(job.get("ranks") or [])]
    sys.stdout.write("\n".join(lines) + "\n")


def _queue_lines(job: dict) -> list[str]:
    """A QUEUED job's place in line and its estimated start, as the last scheduler tick saw."""
    position = job.get("queue_position")
    if position is None:
        return [f"{'position:':<15} {_name(job.get('estimate_reason'))}"]
    place = f"{position} on its cluster, {_name(job.get('team_queue_position'))} in its team"
    ahead = job.get("ahead_jobs") or 0
    if ahead:
        place += f"; {ahead} job(s) asking for {_name(job.get('ahead_gpus'))} GPU(s) ahead"
    start = job.get("estimated_start")
    when = (
        f"by {str(start)[:19].replace('T', ' ')} UTC (if running jobs run to their time limits)"
        if start
        else f"none: {_name(job.get('estimate_reason'))}"
    )
    return [f"{'position:':<15} {place}", f"{'est. start:':<15} {when}"]


def _rank_table(ranks: list[dict]) -> list[str]:
    """The ranks as aligned columns (no rich: `sf job status` stays fast)."""
    if not ranks:
        return ["  none reported yet"]
    rows = [("RANK", "NODE", "STATE", "EXIT")] + [
        (
            _name(r.get("rank")),
            _name(r.get("node")),
            _name(r.get("state")),
            _name(r.get("exit_code")),
        )
        for r in ranks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[3] for row in rows
    ]


def cmd_why(args: argparse.Namespace) -> None:
    """Print the job's Diagnostics: why it waits, runs, or ended where it is."""
    client = _client(args)
    answer = client.request("GET", f"/api/v1/jobs/{_job_id(client, args)}/diagnostics")
    if args.json:
        _print_json(answer)
        return
    sys.stdout.write(f"{answer['status']}\n" + "".join(f"- {s}\n" for s in answer["sentences"]))


def _status_value(job: dict, key: str) -> str:
    if key == "cluster" and job.get("backend"):
        return f"{_name(job.get('cluster'))} ({job['backend']})"
    if key == "gpus":
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
    return _name(job.get(key))


def _gpus(job: dict) -> str:
    """GPUs in all, and how they are made up: "8 (2 nodes × 4 a100)", "1 (a100)"."""
    nodes, kind = job.get("nodes") or 1, job.get("gpu_type") or ""
    parts = []
    if nodes > 1:
        parts.append(
            f"{nodes} nodes × {_name(job.get('gpus_per_node'))}" + (f" {kind}" if kind else "")
        )
    elif kind:
        parts.append(kind)
    if job.get("virtual_gpus"):
        parts.append("virtual slots")
    return _name(job.get("gpus")) + (f" ({', '.join(parts)})" if parts else "")


def _mib(mib: int) -> str:
    """A size in MiB in the largest binary unit it reaches: 65536 is "64 GiB"."""
    for unit, size in (("TiB", 1024 * 1024), ("GiB", 1024)):
        if mib >= size:
            return f"{mib / size:.4g} {unit}"
    return f"{mib} MiB"


def cmd_list(args: argparse.Namespace) -> None:
    """List jobs as a rich table (or JSON); --watch redraws the table until Ctrl-C."""
    if args.watch or args.interval is not None:
        _watch_list(args)
        return
    client = _client(args)
    if args.json:  # the jobs as the API has them, every task of an array too
        _print_json(_list_items(client, args))
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
    rows = [_array_row(a) for a in client.request("GET", "/api/v1/arrays", query=query)]
    if args.status:  # an array is listed while a task of it is in that status
        rows = [r for r in rows if args.status.upper() in r["counts"]]
    merged = sorted(jobs + rows, key=lambda r: str(r.get("submitted_at") or ""), reverse=True)
    return merged[: args.limit]


def _array_row(array: dict) -> dict:
    cap = array.get("max_parallel")
    return {
        "id": f"a{array['id']}",
        "name": array.get("name"),
        "status": array.get("summary"),
        "counts": array.get("counts") or {},
        "gpus": None,
        "attempt": None,
        "team": array.get("team"),
        "user": array.get("user"),
        "submitted_at": array.get("created_at"),
        "status_reason": f"array of {array.get('size')} tasks"
        + (f", at most {cap} at once" if cap else ""),
    }


def _watch_list(args: argparse.Namespace) -> None:
    """Fetch and redraw the job table every --interval seconds until Ctrl-C, which is how a
    watch is left, so it exits 0. A terminal sees the table redrawn in place; anything else
    (a pipe, a log file) gets every table, a blank line after each, since there is no place."""
    if not args.watch:
        _usage(args.parser, "--interval goes with --watch")
    if args.json:
        _usage(args.parser, "--watch redraws a table for people; scripts poll `sf job list --json`")
    interval = WATCH_DEFAULT_S if args.interval is None else args.interval
    if not WATCH_MIN_S <= interval < float("inf"):
        _usage(args.parser, f"--interval must be a number of seconds, at least {WATCH_MIN_S:g}")
    client = _client(args)
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

    _console().print(_jobs_table(items))  # piped: 200 columns, no terminal width to fit


def _jobs_table(items: list[dict]) -> Any:

    table = _table()
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
        row = [job.get(k) for k in ("id", "name", "status", "queue_position", "gpus", "attempt")]
        row += [job.get("team"), job.get("user")]
        reason = _name(job.get("status_reason")).split("\n")[0]
        table.add_row(*map(_name, row), submitted, reason)
    return table


def _array_id(value: Any) -> int | None:
    """N of an "aN" id (an array's), else None."""
    text = str(value or "")
    return int(text[1:]) if text[:1] == "a" and text[1:].isdigit() else None


def cmd_action(args: argparse.Namespace) -> None:
    """POST stop/pause/resume/retry and print the resulting status."""
    client = _client(args)
    array = _array_id(args.id)
    if array is not None:
        _array_action(client, args, array)
        return
    if getattr(args, "failed", False):
        _usage(args.parser, "--failed goes with an array id: sf job retry aN --failed")
    job = client.request("POST", f"/api/v1/jobs/{_job_id(client, args)}/{args.verb}")
    if args.json:
        _print_json(job)
        return
    reason = job.get("status_reason")
    print(f"job {job.get('id')}: {job.get('status')}" + (f" ({reason})" if reason else ""))


def _array_status(client: Any, args: argparse.Namespace, array: int) -> None:
    """An array's fields and its tasks, one line each (index, job id, status, latest metric
    values, parameters)."""
    shown = client.request("GET", f"/api/v1/arrays/{array}")
    if args.json:
        _print_json(shown)
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
    lines = [f"{label + ':':<15} {_name(value)}" for label, value in fields]
    names = shown.get("metrics") or []
    for task in shown.get("tasks") or []:
        latest = task.get("latest") or {}
        values = " ".join(f"{n}={latest[n]:.4g}" for n in names if n in latest)
        params = json.dumps(task["params"], sort_keys=True) if task.get("params") else ""
        line = f"  [{task['index']}] job {task['id']} {task['status']}"
        lines.append(" ".join(part for part in (line, values, params) if part))
    sys.stdout.write("\n".join(lines) + "\n")


def _array_action(client: Any, args: argparse.Namespace, array: int) -> None:
    body = {"failed": bool(getattr(args, "failed", False))}
    done = client.request("POST", f"/api/v1/arrays/{array}/{args.verb}", json_body=body)
    if args.json:
        _print_json(done)
        return
    counts = ", ".join(f"{n} {state}" for state, n in (done.get("counts") or {}).items())
    print(
        f"array a{array} {args.verb}: {done['acted']} task(s) moved, {done['left']} left as "
        f"they were; now {counts or 'no tasks'}"
    )


def cmd_delete(args: argparse.Namespace) -> None:
    """DELETE a finished job; its snapshot goes with the last job that used it."""
    _client(args).request("DELETE", f"/api/v1/jobs/{args.id}")
    print(f"job {args.id} deleted")


def cmd_logs(args: argparse.Namespace) -> None:
    """Replay and optionally follow a job's log lines until the server reports `done`."""
    client = _client(args)
    path = f"/api/v1/jobs/{_job_id(client, args)}/logs"
    tail = LOG_TAIL_DEFAULT if args.n is None else args.n
    if tail < 0:
        _usage(args.parser, "-n must be >= 0")
    if args.rank is not None and args.rank < 0:
        _usage(args.parser, "--rank must be >= 0")
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


def cmd_token_create(args: argparse.Namespace) -> None:
    """POST a new token and print its secret, which the server never shows again."""
    body = {"name": args.name, "expires_in_days": args.expires_in_days}
    token = _client(args).request("POST", "/api/v1/tokens", json_body=body)
    if args.json:
        _print_json(token)
        return
    expires = _when(token.get("expires_at")) if token.get("expires_at") else "never"
    print(f"created token {token['id']} {token['name']!r} (expires: {expires})")
    print(token["secret"])
    sys.stderr.write("copy it now: it will not be shown again\n")


def cmd_token_list(args: argparse.Namespace) -> None:
    """List my tokens as a table (or JSON); secrets are never listed."""
    tokens = _client(args).request("GET", "/api/v1/tokens")
    if args.json:
        _print_json(tokens)
        return

    table = _table()
    for col in ("ID", "NAME", "PREFIX", "CREATED", "LAST USED", "EXPIRES", "REVOKED"):
        table.add_column(col, no_wrap=True, overflow="ellipsis" if col == "NAME" else "fold")
    for t in tokens:
        table.add_row(
            _name(t.get("id")),
            _name(t.get("name")),
            _name(t.get("prefix")),
            _when(t.get("created_at")),
            _when(t.get("last_used_at"), "never"),
            _when(t.get("expires_at"), "never"),
            _when(t.get("revoked_at")),
        )
    console = _console()
    console.print(table)


def cmd_token_revoke(args: argparse.Namespace) -> None:
    """DELETE a token: requests carrying it are refused from now on."""
    _client(args).request("DELETE", f"/api/v1/tokens/{args.id}")
    print(f"token {args.id} revoked")


def cmd_usage(args: argparse.Namespace) -> None:
    """GET /api/v1/usage and print one row per team, user, cluster or day, and the total."""
    query = {"team": args.team, "since": args.since, "until": args.until, "by": args.by}
    answer = _client(args).request("GET", "/api/v1/usage", query=query)
    if args.json:
        _print_json(answer)
        return

    table = _table(show_footer=True)
    table.add_column(args.by.upper(), "TOTAL", no_wrap=True)
    table.add_column("GPU-HOURS", f"{answer['total_gpu_hours']:,.2f}", justify="right")
    table.add_column("GPU-SECONDS", f"{answer['total_gpu_seconds']:,.0f}", justify="right")
    borrowed = sum(row.get("borrowed_gpu_hours", 0) for row in answer["rows"])
    table.add_column("BORROWED GPU-HOURS", f"{borrowed:,.2f}", justify="right")
    for row in answer["rows"]:
        table.add_row(
            _name(row.get(args.by)),
            f"{row['gpu_hours']:,.2f}",
            f"{row['gpu_seconds']:,.0f}",
            f"{row.get('borrowed_gpu_hours', 0):,.2f}",
        )
    console = _console()
    console.print(f"GPU usage {answer['since']} to {answer['until']} (UTC, until excluded)")
    console.print(table)


def cmd_notify_add(args: argparse.Namespace) -> None:
    """POST a webhook and print its signing secret, which receivers need to trust deliveries."""
    body = {"url": args.target, "on": args.on, "team": args.team, "wait_after_s": args.wait}
    hook = _client(args).request("POST", "/api/v1/webhooks", json_body=body)
    if args.json:
        _print_json(hook)
        return
    print(f"added webhook {hook['id']} ({_scope(hook)}) on {_events(hook)}: {hook['url']}")
    print(f"secret: {hook['secret']}")
    sys.stderr.write(
        "the secret signs the Starforge-Signature header of every delivery (HMAC-SHA256); "
        f"`sf notify show {hook['id']}` shows it again\n"
    )


def cmd_notify_list(args: argparse.Namespace) -> None:
    """List the webhooks I manage as a table (or JSON); secrets only in `sf notify show`."""
    hooks = _client(args).request("GET", "/api/v1/webhooks")
    if args.json:
        _print_json(hooks)
        return

    table = _table()
    for col in ("ID", "SCOPE", "ON", "KIND"):
        table.add_column(col, no_wrap=True, overflow="fold")
    table.add_column("URL", no_wrap=True, overflow="ellipsis")
    for hook in hooks:
        row = (hook.get("id"), _scope(hook), _events(hook), hook.get("kind"), hook.get("url"))
        table.add_row(*map(_name, row))
    console = _console()
    console.print(table)


def cmd_notify_show(args: argparse.Namespace) -> None:
    """Show one webhook, its secret, and its latest deliveries with every try: why a receiver
    heard nothing is in the tries' statuses and details."""
    hook = _client(args).request("GET", f"/api/v1/webhooks/{args.id}")
    if args.json:
        _print_json(hook)
        return
    from sf.project import say_duration

    fields = [
        ("id", hook.get("id")),
        ("url", hook.get("url")),
        ("kind", hook.get("kind")),
        ("scope", _scope(hook)),
        ("owner", hook.get("owner")),
        ("on", _events(hook)),
        ("wait after", say_duration(hook.get("wait_after_s") or 0)),
        ("private ok", "yes (set by staff)" if hook.get("allow_private") else "no"),
        ("created", _when(hook.get("created_at"))),
        ("secret", hook.get("secret")),
    ]
    lines = [f"{label + ':':<15} {_name(value)}" for label, value in fields]
    lines += ["deliveries:", *_delivery_lines(hook.get("deliveries") or [], hook.get("id"))]
    sys.stdout.write("\n".join(lines) + "\n")


def _delivery_lines(deliveries: list[dict], hook_id: Any) -> list[str]:
    """Latest first, each delivery then its tries: time, HTTP status (none: no answer), detail."""
    if not deliveries:
        return [f"  none yet: `sf notify test {hook_id}` sends one"]
    lines = []
    for d in deliveries:
        job = f"job {d['job_id']}" if d.get("job_id") is not None else "no job"
        head = f"  {d.get('id')} {_name(d.get('state'))} {_name(d.get('event'))} {job}"
        head += f", created {_when(d.get('created_at'))}"
        if d.get("next_at"):
            head += f", next try {_when(d['next_at'])}"
        lines.append(head)
        lines += [
            f"    {_second(t.get('at'))}  {_name(t.get('status') or 'none'):<4}  "
            f"{_name(t.get('detail'))}"
            for t in d.get("tries") or []
        ]
        if not d.get("tries"):
            lines.append("    not tried yet")
    return lines


def cmd_notify_remove(args: argparse.Namespace) -> None:
    """DELETE a webhook: nothing more is sent to it, and its delivery log goes with it."""
    _client(args).request("DELETE", f"/api/v1/webhooks/{args.id}")
    print(f"webhook {args.id} removed")


def cmd_notify_test(args: argparse.Namespace) -> None:
    """POST a test delivery; the server sends it in the background, so say where to look."""
    delivery = _client(args).request("POST", f"/api/v1/webhooks/{args.id}/test")
    if args.json:
        _print_json(delivery)
        return
    print(f"test delivery {delivery['id']} (Idempotency-Key {delivery['key']}) queued")
    print(f"it is sent in the background: `sf notify show {args.id}` shows how it went")


def _scope(hook: dict) -> str:
    return f"team {hook['team']}" if hook.get("scope") == "team" else "mine"


def _events(hook: dict) -> str:
    on = hook.get("on") or []
    text = ", ".join(on) or "-"
    if "waiting-too-long" in on and hook.get("wait_after_s"):
        from sf.project import say_duration

        text += f" (after {say_duration(hook['wait_after_s'])})"
    return text


def _second(value: Any) -> str:
    return str(value)[:19].replace("T", " ") if value else "-"


def _when(value: Any, empty: str = "-") -> str:
    return str(value)[:16].replace("T", " ") if value else empty


def cmd_team_list(args: argparse.Namespace) -> None:
    """List my teams as a table (or JSON): my role in each, and whether I may manage it."""
    teams = _client(args).request("GET", "/api/v1/teams")
    if args.json:
        _print_json(teams)
        return

    table = _table()
    for col in ("NAME", "ROLE", "MEMBERS", "GPU QUOTA", "CAN MANAGE"):
        table.add_column(col, no_wrap=True, overflow="fold")
    for team in teams:
        table.add_row(
            _name(team.get("name")),
            _team_role(team),
            str(len(team.get("members") or [])),
            _name((team.get("quotas") or {}).get("gpu_quota")),
            "yes" if team.get("can_manage") else "no",
        )
    _console().print(table)


def cmd_team_show(args: argparse.Namespace) -> None:
    """Show one team: what staff allow it (quotas), what its jobs get when they name nothing
    (defaults), and who is in it with which role."""
    team = _client(args).request("GET", f"/api/v1/teams/{_segment(args.name)}")
    if args.json:
        _print_json(team)
        return
    from sf.project import say_duration

    quotas, defaults = team.get("quotas") or {}, team.get("defaults") or {}
    month = quotas.get("gpu_hours_per_month")
    limit = defaults.get("default_time_limit_s")
    lines = _labelled(
        ("team", team.get("name")),
        ("my role", _team_role(team)),
        ("can manage", "yes" if team.get("can_manage") else "no"),
    )
    lines += ["quotas (set by staff):"] + _labelled(
        ("gpu quota", quotas.get("gpu_quota")),
        ("max jobs", _or_none(quotas.get("max_jobs"))),
        ("gpu-hours/month", "none" if month is None else f"{month:g}"),
        ("budget hard stop", "yes" if quotas.get("budget_hard_stop") else "no"),
        ("user gpu cap", _or_none(quotas.get("user_gpu_cap"))),
        ("max gpus per job", _or_none(quotas.get("max_gpus_per_job"))),
        ("max priority", quotas.get("max_member_priority")),
        indent=2,
    )
    lines += ["defaults:"] + _labelled(
        ("cluster", _or_none(defaults.get("default_cluster"))),
        ("window", _or_none(defaults.get("window"))),
        ("max retries", defaults.get("default_max_retries")),
        ("retry cooldown", say_duration(defaults.get("default_retry_cooldown_s") or 0)),
        ("time limit", say_duration(limit) if limit else "none"),
        indent=2,
    )
    members = team.get("members") or []
    width = max((len(m.get("username", "")) for m in members), default=0)
    lines += [f"members ({len(members)}):"]
    lines += [f"  {m.get('username', ''):<{width}}  {_name(m.get('role'))}" for m in members]
    sys.stdout.write("\n".join(lines) + "\n")


def cmd_team_add_member(args: argparse.Namespace) -> None:
    """POST a membership; the server checks that I am the team's admin and the user exists."""
    body = {"username": args.username, "role": args.role}
    path = f"/api/v1/teams/{_segment(args.name)}/members"
    member = _client(args).request("POST", path, json_body=body)
    print(f"added {member['username']} to team {args.name} as {member['role']}")


def cmd_team_remove_member(args: argparse.Namespace) -> None:
    """DELETE a membership; the server refuses to remove a team's last admin."""
    path = f"/api/v1/teams/{_segment(args.name)}/members/{_segment(args.username)}"
    _client(args).request("DELETE", path)
    print(f"removed {args.username} from team {args.name}")


def cmd_team_set_role(args: argparse.Namespace) -> None:
    """PATCH a member's role; the server refuses to demote a team's last admin."""
    path = f"/api/v1/teams/{_segment(args.name)}/members/{_segment(args.username)}"
    member = _client(args).request("PATCH", path, json_body={"role": args.role})
    print(f"{member['username']} is now {member['role']} in team {args.name}")


def _labelled(*fields: tuple[str, Any], indent: int = 0) -> list[str]:
    # One column for the values of every section: labels padded to the widest, indent included.
    return [f"{' ' * indent}{label + ':':<{20 - indent}} {_name(value)}" for label, value in fields]


def _team_role(team: dict) -> str:
    # No role: staff reading a team they are not in.
    return _name(team.get("role")) if team.get("role") else "- (staff)"


def _or_none(value: Any) -> Any:
    return "none" if value is None else value


def _segment(text: str) -> str:
    """`text` as one path segment: a name with / or ? must not change which URL is asked."""
    from urllib.parse import quote

    return quote(text, safe="")


def _console() -> Any:
    """rich's console; piped, 200 columns wide (no terminal width to fit: columns stay whole)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def _table(**options: Any) -> Any:
    """The CLI's tables: no box, bold headers, flush left."""
    from rich.table import Table

    return Table(box=None, header_style="bold", pad_edge=False, **options)


def cmd_completion(args: argparse.Namespace) -> None:
    """Print a completion script made from the parser, so that a command or option is
    completed as soon as it exists; zsh runs the bash one through its bashcompinit."""
    script = _bash_completion(build_parser())
    sys.stdout.write(ZSH_PRELUDE + script if args.shell == "zsh" else script)


ZSH_PRELUDE = """# zsh completion for sf: load it with eval "$(sf completion zsh)" in ~/.zshrc.
# It is the bash completion, run by zsh's bashcompinit (which needs compinit).
(( $+functions[compdef] )) || { autoload -U +X compinit && compinit }
(( $+functions[complete] )) || { autoload -U +X bashcompinit && bashcompinit }
"""

# Bash 3.2 (macOS) and zsh's bashcompinit run this too: no associative arrays, and no
# variable called path or words (zsh's own). `_sf_words` etc. are generated: see _sf_cases.
BASH_COMPLETE = r"""
_sf_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}" at='' word i=1 npos=0 _sf_reply='' _sf_opts=''
    COMPREPLY=()
    while [ "$i" -lt "$COMP_CWORD" ]; do
        word="${COMP_WORDS[i]}"
        case "$word" in
            --) return 0 ;;  # the job's own command follows: the shell's default completion
            -*)
                if _sf_values "$at|$word" || _sf_values "$word"; then
                    i=$((i + 1))  # its value
                    if [ "$i" -eq "$COMP_CWORD" ]; then
                        COMPREPLY=($(compgen -W "$_sf_reply" -- "$cur"))
                        return 0
                    fi
                fi ;;
            *)
                if _sf_words "${at:+$at }$word"; then
                    at="${at:+$at }$word"
                    npos=0
                else
                    npos=$((npos + 1))
                fi ;;
        esac
        i=$((i + 1))
    done
    _sf_words "$at"
    local subs="$_sf_reply" opts="$_sf_opts" candidates
    _sf_positional "$at|$npos"
    candidates="$subs $_sf_reply"
    case "$cur" in
        -*) candidates="$opts" ;;
        *) [ -n "$subs$_sf_reply" ] || candidates="$opts" ;;
    esac
    COMPREPLY=($(compgen -W "$candidates" -- "$cur"))
}

complete -o default -F _sf_complete sf
"""


def _bash_completion(parser: argparse.ArgumentParser) -> str:
    words, values, positionals = _sf_cases(parser)
    return (
        f"# bash completion for sf {__version__}, made from its parser by `sf completion bash`.\n"
        "# Load it with: source <(sf completion bash)\n\n"
        "_sf_words() {\n"
        "    # A command path's sub-commands (_sf_reply) and options (_sf_opts); 1: no command.\n"
        + _shell_case(words, "*) return 1 ;;")
        + "}\n\n_sf_values() {\n"
        "    # [PATH|]OPTION: 0 when the option takes a value; its choices in _sf_reply.\n"
        + _shell_case(values, "*) return 1 ;;")
        + "}\n\n_sf_positional() {\n"
        "    # PATH|N: the choices of the command's positional argument N (from 0), if any.\n"
        + _shell_case(positionals, "*) _sf_reply='' ;;")
        + "}\n"
        + BASH_COMPLETE
    )


def _sf_cases(parser: argparse.ArgumentParser) -> tuple[dict, dict, dict]:
    """What the completion asks of the parser, keyed as the script asks: a command path to
    its (sub-commands, options); an option that takes a value to its choices (by "PATH|OPTION"
    only where commands disagree on it); "PATH|N" to the choices of positional argument N."""
    words: dict[str, str] = {}
    takes: dict[str, dict[str, str | None]] = {}  # option -> path -> its choices (None: a flag)
    positionals: dict[str, str] = {}
    for at, p in _command_paths(parser):
        subs: list[str] = []
        opts: list[str] = []
        n = 0
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):
                subs += list(action.choices)
                continue
            choices = " ".join(map(str, action.choices or ()))
            if not action.option_strings:
                if choices:
                    positionals[f"{at}|{n}"] = choices
                n += 1
                continue
            opts += action.option_strings
            for opt in action.option_strings:
                takes.setdefault(opt, {})[at] = None if action.nargs == 0 else choices
        words[at] = f"_sf_reply={_sh(' '.join(subs))}; _sf_opts={_sh(' '.join(opts))}"
    values: dict[str, str] = {}
    for opt, by_path in takes.items():
        if len(set(by_path.values())) == 1:
            by_path = {"": next(iter(by_path.values()))}  # one answer wherever it appears
        for at, offered in by_path.items():
            if offered is not None:
                values[f"{at}|{opt}" if at else opt] = f"_sf_reply={_sh(offered)}"
    return words, values, {k: f"_sf_reply={_sh(v)}" for k, v in positionals.items()}


def _command_paths(parser: argparse.ArgumentParser, at: str = "") -> Any:
    """Every command path ("", "job", "job list", ...) with its parser. argparse lists its
    sub-commands only in its actions, so this reads them as completion tools do."""
    yield at, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _command_paths(child, f"{at} {name}".strip())


def _shell_case(arms: dict[str, str], default: str) -> str:
    """A `case "$1"` with one arm per distinct body, its keys joined: the script stays short."""
    keys: dict[str, list[str]] = {}
    for key, body in arms.items():
        keys.setdefault(body, []).append(_sh(key))
    lines = [f"        {'|'.join(k)}) {body} ;;" for body, k in keys.items()]
    return (
        '    case "$1" in\n' + "".join(f"{ln}\n" for ln in lines) + f"        {default}\n    esac\n"
    )


def _sh(text: str) -> str:
    import shlex

    return shlex.quote(text)


if __name__ == "__main__":
    sys.exit(main())
