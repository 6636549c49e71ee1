"""Owns `sf notify`: webhooks that tell me (or a team's admins) when jobs end, fail or wait
too long, added with their signing secret, listed, shown with their deliveries, tested and
removed."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sf.commands.common import (
    api_client,
    display,
    duration_option,
    print_json,
    rich_console,
    rich_table,
    when,
)

# For the help only: the server's list is the one that counts, and it names an unknown event.
# Mirrors jobs.models.Webhook.Event (tests/client/test_mirrors.py).
NOTIFY_EVENTS = (
    "succeeded",
    "failed",
    "stopped",
    "preempted",
    "waiting-too-long",
    "budget-alert",
    "idle",
    "suspected-hang",
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
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
    # Not dest "url": that is --url, the server's (`common_options`).
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
        type=duration_option,
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


def cmd_notify_add(args: argparse.Namespace) -> None:
    """POST a webhook and print its signing secret, which receivers need to trust deliveries."""
    body = {"url": args.target, "on": args.on, "team": args.team, "wait_after_s": args.wait}
    hook = api_client(args).request("POST", "/api/v1/webhooks", json_body=body)
    if args.json:
        print_json(hook)
        return
    print(f"added webhook {hook['id']} ({_scope(hook)}) on {_events(hook)}: {hook['url']}")
    print(f"secret: {hook['secret']}")
    sys.stderr.write(
        "the secret signs the Starforge-Signature header of every delivery (HMAC-SHA256); "
        f"`sf notify show {hook['id']}` shows it again\n"
    )


def cmd_notify_list(args: argparse.Namespace) -> None:
    """List the webhooks I manage as a table (or JSON); secrets only in `sf notify show`."""
    hooks = api_client(args).request("GET", "/api/v1/webhooks")
    if args.json:
        print_json(hooks)
        return

    table = rich_table()
    for col in ("ID", "SCOPE", "ON", "KIND"):
        table.add_column(col, no_wrap=True, overflow="fold")
    table.add_column("URL", no_wrap=True, overflow="ellipsis")
    for hook in hooks:
        row = (hook.get("id"), _scope(hook), _events(hook), hook.get("kind"), hook.get("url"))
        table.add_row(*map(display, row))
    console = rich_console()
    console.print(table)


def cmd_notify_show(args: argparse.Namespace) -> None:
    """Show one webhook, its secret, and its latest deliveries with every try: why a receiver
    heard nothing is in the tries' statuses and details."""
    hook = api_client(args).request("GET", f"/api/v1/webhooks/{args.id}")
    if args.json:
        print_json(hook)
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
        ("created", when(hook.get("created_at"))),
        ("secret", hook.get("secret")),
    ]
    lines = [f"{label + ':':<15} {display(value)}" for label, value in fields]
    lines += ["deliveries:", *_delivery_lines(hook.get("deliveries") or [], hook.get("id"))]
    sys.stdout.write("\n".join(lines) + "\n")


def _delivery_lines(deliveries: list[dict], hook_id: Any) -> list[str]:
    """Latest first, each delivery then its tries: time, HTTP status (none: no answer), detail."""
    if not deliveries:
        return [f"  none yet: `sf notify test {hook_id}` sends one"]
    lines = []
    for d in deliveries:
        job = f"job {d['job_id']}" if d.get("job_id") is not None else "no job"
        head = f"  {d.get('id')} {display(d.get('state'))} {display(d.get('event'))} {job}"
        head += f", created {when(d.get('created_at'))}"
        if d.get("next_at"):
            head += f", next try {when(d['next_at'])}"
        lines.append(head)
        lines += [
            f"    {_second(t.get('at'))}  {display(t.get('status') or 'none'):<4}  "
            f"{display(t.get('detail'))}"
            for t in d.get("tries") or []
        ]
        if not d.get("tries"):
            lines.append("    not tried yet")
    return lines


def cmd_notify_remove(args: argparse.Namespace) -> None:
    """DELETE a webhook: nothing more is sent to it, and its delivery log goes with it."""
    api_client(args).request("DELETE", f"/api/v1/webhooks/{args.id}")
    print(f"webhook {args.id} removed")


def cmd_notify_test(args: argparse.Namespace) -> None:
    """POST a test delivery; the server sends it in the background, so say where to look."""
    delivery = api_client(args).request("POST", f"/api/v1/webhooks/{args.id}/test")
    if args.json:
        print_json(delivery)
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
