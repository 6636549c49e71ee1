"""Owns `sf submit`: the job's options over its starforge.toml, the directory's snapshot
uploaded for the job's team, and the job (or, with --array or --array-file, the array) made."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from sf.commands.arrays import array_fields, submit_array
from sf.commands.common import (
    CliError,
    api_client,
    duration_option,
    print_json,
    usage_error,
)
from sf.contract import Failure

# The causes --max-retries retries, as the server decides (sf.contract.Failure), in its order.
RETRYABLE = ", ".join(cause for cause in Failure if cause in Failure.retryable())
# The snapshot's size cap where --max-snapshot-mb does not say (the server has its own).
MAX_SNAPSHOT_VAR = "SF_MAX_SNAPSHOT_MB"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="GPUs per node, each rank's (default 1, >= 0); the job holds nodes x N in all",
    )
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
        type=duration_option,
        metavar="DURATION",
        help="stop the job once it has run this long, e.g. 90m, 4h, 1d12h or 36:00:00; "
        "never retried automatically (default: the team's)",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        metavar="N",
        help=f"retry automatically up to N times after a retryable failure ({RETRYABLE}; "
        "default: team's)",
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
    _add_submission_options(p)
    p.set_defaults(handler=cmd_submit, parser=p)


def _add_submission_options(p: argparse.ArgumentParser) -> None:
    """How the job is submitted rather than what it is: the snapshot, an array's tasks, the
    answer's form."""
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


def cmd_submit(args: argparse.Namespace) -> None:
    """Snapshot the directory, upload it, and create the job."""
    payload = _submit_payload(args)
    array = array_fields(args)  # checked before the snapshot is made and uploaded
    client = api_client(args)
    # Snapshots belong to teams: upload for the team the job is submitted to.
    payload["team"] = payload["team"] or _default_team(client)
    payload["snapshot"] = _upload_snapshot(client, args, payload["team"])
    if array:
        submit_array(client, args, {**payload, **array})
        return
    job = client.request("POST", "/api/v1/jobs", json_body=payload)
    if args.json:
        print_json(job)
        return
    print(f"submitted job {job['id']} run_id {job.get('run_id', '-')} ({job.get('status', '-')})")
    print(f"follow it: sf job logs {job['id']}")


# The option that sets a field of [job] (sf.project.KEYS), where it is not the field's name.
OPTION_OF = {"pending_deadline_s": "pending_deadline", "retry_cooldown_s": "retry_cooldown"}


# The API's field for a key of [job], where it is not the key's name. `gpus` (the option's and
# the file's name, per node as ever) is sent under the API's explicit name for it.
FIELD_OF = {"time_limit": "time_limit_s", "gpus": "gpus_per_node"}


# What a field is when neither an option nor starforge.toml gives it (others: the server's).
SUBMIT_DEFAULTS = {"nodes": 1, "gpus": 1, "priority": 0, "window_policy": "wait", "then": []}


# Each numeric option's lowest value, and how its refusal says it.
BOUNDS = (
    ("nodes", 1, ">= 1"),
    ("gpus", 0, ">= 0"),
    ("cpus", 1, ">= 1"),
    ("pending_deadline", 1, "a positive number of seconds"),  # an int: > 0
    ("max_retries", 0, ">= 0"),
    ("retry_cooldown", 0, ">= 0 seconds"),
)


def _submit_payload(args: argparse.Namespace) -> dict:
    from sf.project import KEYS, ProjectError, job_defaults

    if args.stray:
        usage_error(args.parser, "put the job command after --, e.g. sf submit -- python train.py")
    try:
        defaults = job_defaults(args.dir)
    except ProjectError as exc:
        usage_error(args.parser, str(exc))
    command = args.command or defaults.get("entrypoint")
    if not command:
        usage_error(
            args.parser,
            "missing command after --, e.g. sf submit -- python train.py"
            + (" (or an entrypoint in [job] of starforge.toml)" if defaults else ""),
        )
    for option, low, words in BOUNDS:
        value = getattr(args, option)
        if value is not None and value < low:
            usage_error(args.parser, f"--{option.replace('_', '-')} must be {words}")
    env = dict(defaults.get("env", {}))  # --env K=V replaces the file's K, keeps the rest
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            usage_error(args.parser, f"--env expects K=V, got {item!r}")
        env[key] = value
    payload = {"entrypoint": command, "snapshot": None, "env": env}
    for field in [f for f in KEYS if f not in payload]:
        given = getattr(args, OPTION_OF.get(field, field))
        value = defaults.get(field, SUBMIT_DEFAULTS.get(field)) if given is None else given
        payload[FIELD_OF.get(field, field)] = value
    return payload


def _max_snapshot_mb(args: argparse.Namespace) -> float:
    from sf.snapshot import DEFAULT_MAX_MB

    if args.max_snapshot_mb is not None:
        value = args.max_snapshot_mb
    else:
        raw = os.environ.get(MAX_SNAPSHOT_VAR, "")
        try:
            value = float(raw) if raw else DEFAULT_MAX_MB
        except ValueError:
            usage_error(args.parser, f"{MAX_SNAPSHOT_VAR} must be a number, got {raw!r}")
    if value <= 0:
        usage_error(args.parser, "--max-snapshot-mb must be > 0")
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
