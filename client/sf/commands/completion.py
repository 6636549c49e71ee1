"""Owns `sf completion bash|zsh`: a completion script made from the parser that parsed this
command line, so that a command or option is completed as soon as it exists."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sf import __version__


def add_parser(sub: Any, root: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for bash or zsh, made from this sf's own "
        'commands. Load it with: source <(sf completion bash), or eval "$(sf completion zsh)" '
        "in ~/.zshrc.",
    )
    p.add_argument("shell", metavar="SHELL", choices=("bash", "zsh"), help="bash or zsh")
    # The whole tree, so that the script knows every command (`sf` has no other way up).
    p.set_defaults(handler=cmd_completion, parser=p, root=root)


def cmd_completion(args: argparse.Namespace) -> None:
    """Print a completion script made from the parser, so that a command or option is
    completed as soon as it exists; zsh runs the bash one through its bashcompinit."""
    script = _bash_completion(args.root)
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
