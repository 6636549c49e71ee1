"""Owns `sf token`: my API tokens created (the secret shown once), listed and revoked."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sf.commands.common import api_client, display, print_json, rich_console, rich_table, when


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
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


def cmd_token_create(args: argparse.Namespace) -> None:
    """POST a new token and print its secret, which the server never shows again."""
    body = {"name": args.name, "expires_in_days": args.expires_in_days}
    token = api_client(args).request("POST", "/api/v1/tokens", json_body=body)
    if args.json:
        print_json(token)
        return
    expires = when(token.get("expires_at")) if token.get("expires_at") else "never"
    print(f"created token {token['id']} {token['name']!r} (expires: {expires})")
    print(token["secret"])
    sys.stderr.write("copy it now: it will not be shown again\n")


def cmd_token_list(args: argparse.Namespace) -> None:
    """List my tokens as a table (or JSON); secrets are never listed."""
    tokens = api_client(args).request("GET", "/api/v1/tokens")
    if args.json:
        print_json(tokens)
        return

    table = rich_table()
    for col in ("ID", "NAME", "PREFIX", "CREATED", "LAST USED", "EXPIRES", "REVOKED"):
        table.add_column(col, no_wrap=True, overflow="ellipsis" if col == "NAME" else "fold")
    for t in tokens:
        table.add_row(
            display(t.get("id")),
            display(t.get("name")),
            display(t.get("prefix")),
            when(t.get("created_at")),
            when(t.get("last_used_at"), "never"),
            when(t.get("expires_at"), "never"),
            when(t.get("revoked_at")),
        )
    console = rich_console()
    console.print(table)


def cmd_token_revoke(args: argparse.Namespace) -> None:
    """DELETE a token: requests carrying it are refused from now on."""
    api_client(args).request("DELETE", f"/api/v1/tokens/{args.id}")
    print(f"token {args.id} revoked")
