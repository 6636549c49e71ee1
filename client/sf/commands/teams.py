"""Owns `sf team`: my teams listed, one shown (quotas, defaults, members), and a team admin's
member changes (add, remove, change a role)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sf.commands.common import CliError, api_client, display, print_json, rich_console, rich_table

# The API's roles (jobs/api/teams.py); choices here so a typo is caught, and completed, locally.
TEAM_ROLES = ("member", "viewer", "admin")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
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
    policy = verbs.add_parser(
        "set",
        parents=[common],
        help="the team's idle and hang policy (team admins): idle_after=30m idle_grace=10m "
        "idle_action=pause|stop hang_after=15m hang_action=notify|fail|stop (off: none)",
    )
    policy.add_argument("name", metavar="TEAM")
    policy.add_argument("settings", metavar="KEY=VALUE", nargs="+")
    policy.set_defaults(handler=cmd_team_set, parser=policy)
    team.set_defaults(handler=None, parser=team)


def cmd_team_list(args: argparse.Namespace) -> None:
    """List my teams as a table (or JSON): my role in each, and whether I may manage it."""
    teams = api_client(args).request("GET", "/api/v1/teams")
    if args.json:
        print_json(teams)
        return

    table = rich_table()
    for col in ("NAME", "ROLE", "MEMBERS", "GPU QUOTA", "CAN MANAGE"):
        table.add_column(col, no_wrap=True, overflow="fold")
    for team in teams:
        table.add_row(
            display(team.get("name")),
            _team_role(team),
            str(len(team.get("members") or [])),
            display((team.get("quotas") or {}).get("gpu_quota")),
            "yes" if team.get("can_manage") else "no",
        )
    rich_console().print(table)


def cmd_team_show(args: argparse.Namespace) -> None:
    """Show one team: what staff allow it (quotas), what its jobs get when they name nothing
    (defaults), and who is in it with which role."""
    team = api_client(args).request("GET", f"/api/v1/teams/{_segment(args.name)}")
    if args.json:
        print_json(team)
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
        ("money/month", _or_none(quotas.get("money_budget_per_month"))),
        ("budget alerts at", _percents(quotas.get("budget_alert_percents"))),
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
    lines += [f"  {m.get('username', ''):<{width}}  {display(m.get('role'))}" for m in members]
    sys.stdout.write("\n".join(lines) + "\n")


def cmd_team_add_member(args: argparse.Namespace) -> None:
    """POST a membership; the server checks that I am the team's admin and the user exists."""
    body = {"username": args.username, "role": args.role}
    path = f"/api/v1/teams/{_segment(args.name)}/members"
    member = api_client(args).request("POST", path, json_body=body)
    print(f"added {member['username']} to team {args.name} as {member['role']}")


def cmd_team_remove_member(args: argparse.Namespace) -> None:
    """DELETE a membership; the server refuses to remove a team's last admin."""
    path = f"/api/v1/teams/{_segment(args.name)}/members/{_segment(args.username)}"
    api_client(args).request("DELETE", path)
    print(f"removed {args.username} from team {args.name}")


def cmd_team_set_role(args: argparse.Namespace) -> None:
    """PATCH a member's role; the server refuses to demote a team's last admin."""
    path = f"/api/v1/teams/{_segment(args.name)}/members/{_segment(args.username)}"
    member = api_client(args).request("PATCH", path, json_body={"role": args.role})
    print(f"{member['username']} is now {member['role']} in team {args.name}")


# `sf team set`'s keys: the policy's durations (the API's *_s fields) and its actions.
POLICY_DURATIONS = ("idle_after", "idle_grace", "hang_after")
POLICY_ACTIONS = {"idle_action": ("pause", "stop"), "hang_action": ("notify", "fail", "stop")}


def cmd_team_set(args: argparse.Namespace) -> None:
    """PATCH the team's activity policy; the server refuses anyone but its admins (403)."""
    body = policy_changes(args.settings)
    path = f"/api/v1/teams/{_segment(args.name)}/activity-policy"
    policy = api_client(args).request("PATCH", path, json_body=body)
    from sf.project import say_duration

    shown = [
        f"{key.removesuffix('_s')}={say_duration(value) if key.endswith('_s') else value}"
        if value is not None
        else f"{key.removesuffix('_s')}=off"
        for key, value in policy.items()
    ]
    print(f"team {args.name}: " + " ".join(shown))


def policy_changes(settings: list[str]) -> dict[str, Any]:
    """KEY=VALUE words as the API's fields: durations (30m, 1h, off) in seconds, actions."""
    from sf.project import parse_duration

    body: dict[str, Any] = {}
    for word in settings:
        key, sep, value = word.partition("=")
        if not sep:
            raise CliError(f"{word!r} is not KEY=VALUE")
        if key in POLICY_DURATIONS:
            try:
                body[key + "_s"] = None if value in ("off", "none") else parse_duration(value)
            except ValueError as exc:
                raise CliError(f"{key}: {exc}") from exc
        elif value in POLICY_ACTIONS.get(key, ()):
            body[key] = value
        else:
            keys = ", ".join((*POLICY_DURATIONS, *POLICY_ACTIONS))
            raise CliError(
                f"{word!r}: the keys are {keys}; actions are "
                + "; ".join(f"{k} {'|'.join(v)}" for k, v in POLICY_ACTIONS.items())
            )
    return body


def _labelled(*fields: tuple[str, Any], indent: int = 0) -> list[str]:
    # One column for the values of every section: labels padded to the widest, indent included.
    return [
        f"{' ' * indent}{label + ':':<{20 - indent}} {display(value)}" for label, value in fields
    ]


def _team_role(team: dict) -> str:
    # No role: staff reading a team they are not in.
    return display(team.get("role")) if team.get("role") else "- (staff)"


def _or_none(value: Any) -> Any:
    return "none" if value is None else value


def _segment(text: str) -> str:
    """`text` as one path segment: a name with / or ? must not change which URL is asked."""
    from urllib.parse import quote

    return quote(text, safe="")


def _percents(text: object) -> str:
    """A team's alert thresholds ("50,80,100") as "50%, 80%, 100%"; none when empty."""
    if not isinstance(text, str) or not text:
        return "none"
    return ", ".join(f"{part}%" for part in text.split(","))
