"""Owns `sf login`: a URL and token checked against the server, then saved in the config."""

from __future__ import annotations

import argparse
import os
from typing import Any

from sf.commands.common import CliError, display, usage_error


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    login = sub.add_parser("login", parents=[common], help="verify a token and save it")
    login.set_defaults(handler=cmd_login, parser=login)


def cmd_login(args: argparse.Namespace) -> None:
    """Verify URL+token against /api/v1/me and save them to the config file."""
    from sf import config
    from sf.http import Client

    url = getattr(args, "url", None) or os.environ.get(config.URL_VAR)
    token = getattr(args, "token", None) or os.environ.get(config.TOKEN_VAR)
    if not url or not token:
        usage_error(
            args.parser,
            "login needs --url URL and --token TOKEN; make a token on the console's Tokens "
            "page (URL/tokens/) once signed in, by password or single sign-on",
        )
    try:
        me = Client(url, token).request("GET", "/api/v1/me")
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    config.save(url, token)
    teams = ", ".join(display(t) for t in me.get("teams", [])) or "none"
    print(f"logged in to {url} as {display(me.get('username') or me.get('user'))} (teams: {teams})")
