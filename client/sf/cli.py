"""Owns the `sf` command line's entry point: the parser built from the commands (one module
per noun in `sf.commands`), the handler run, and its exit code.

Exit codes: 0 ok, 1 server/config error, 2 usage error, 3 server unreachable.
Only argparse/json/os/sys load at start-up; HTTP, snapshot and rich load inside commands
so `sf --help` and `sf job status` stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys

from sf import __version__
from sf.commands import completion, jobs, login, notify, submit, teams, tokens, usage
from sf.commands.common import CliError, common_options

EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3


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
    if command is not None and args.handler is not submit.cmd_submit:
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


def build_parser() -> argparse.ArgumentParser:
    """Build the full argparse tree for `sf`."""
    common = common_options()
    parser = argparse.ArgumentParser(
        prog="sf", parents=[common], description="Starforge GPU job platform client."
    )
    parser.add_argument("--version", action="version", version=f"sf {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    login.add_parser(sub, common)
    submit.add_parser(sub, common)
    jobs.add_parser(sub, common)
    tokens.add_parser(sub, common)
    usage.add_parser(sub, common)
    notify.add_parser(sub, common)
    teams.add_parser(sub, common)
    completion.add_parser(sub, parser)
    return parser


if __name__ == "__main__":
    sys.exit(main())
