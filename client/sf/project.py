"""Owns the `[job]` table of a project's starforge.toml: the defaults `sf submit` takes from the
directory it submits, checked before anything is uploaded.

The file is the one the server reads from the snapshot for `[then.<name>]` follow-ons
(`jobs/stores/snapshots.py`, `jobs/actions/submit.py`), and an entrypoint is written as there:
a command string, split as a shell would (shlex), or a list of non-empty strings. Keys are
named as the API's fields (`pending_deadline_s`, not `--pending-deadline`), but for
`time_limit`, a duration as `--time-limit` takes it ("4h"), sent as `time_limit_s`. An unknown
key or a value of the wrong type is a ProjectError naming it: nothing of the file is guessed.

Standard library only, like the rest of the client: tomllib, or on Python 3.10 the tomli
package the client depends on there.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10, the client's floor: tomli is the same parser
    import tomli as tomllib

PROJECT_FILE = "starforge.toml"  # mirrors jobs.stores.snapshots.PROJECT_FILE: test_mirrors.py
WINDOW_POLICIES = ("wait", "pause")


class ProjectError(Exception):
    """starforge.toml cannot give `sf submit` its defaults; the message says why."""


class _Invalid(Exception):
    """What a value must be, for the sentence that names its key."""


def _entrypoint(value: Any) -> list[str]:
    argv: list[str] | None
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError:
            argv = None
    elif isinstance(value, list) and all(isinstance(a, str) for a in value):
        argv = value
    else:
        argv = None
    if not argv or any(not a or "\x00" in a for a in argv):
        raise _Invalid(
            "a command string or a list of non-empty strings, without NUL characters and "
            "with balanced quotes"
        )
    return argv


def _whole(minimum: int | None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if type(value) is not int:  # a TOML boolean is not a count
            raise _Invalid("a whole number")
        if minimum is not None and value < minimum:
            raise _Invalid(f"at least {minimum}")
        return value

    return check


DURATION = re.compile(
    r"(?:(?P<d>\d+)\s*d)?\s*(?:(?P<h>\d+)\s*h)?\s*(?:(?P<m>\d+)\s*m(?:in)?)?\s*(?:(?P<s>\d+)\s*s)?",
    re.IGNORECASE,
)
CLOCK = re.compile(r"(?:(?P<d>\d+)-)?(?P<h>\d+):(?P<m>\d{2}):(?P<s>\d{2})")
DURATION_HINT = "a duration with a unit, e.g. 90m, 4h, 1d12h or 36:00:00"


def parse_duration(text: str) -> int:
    """Seconds in a duration as a person writes one: 90m, 4h, 1d12h, 2h30m, 45s, or Slurm's
    [D-]HH:MM:SS. A bare number is refused: Slurm reads it as minutes, other tools as seconds."""
    text = text.strip()
    match = CLOCK.fullmatch(text) or DURATION.fullmatch(text)
    if not text or match is None or not any(match.groupdict().values()):
        raise ValueError(f"{text!r} is not {DURATION_HINT}")
    parts = {k: int(v or 0) for k, v in match.groupdict().items()}
    return parts["d"] * 86400 + parts["h"] * 3600 + parts["m"] * 60 + parts["s"]


def say_duration(seconds: int) -> str:
    """`seconds` as parse_duration reads it back: 4h, 1d12h, 1h30m, 45s."""
    out, left = "", max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            out += f"{left // size}{unit}"
            left %= size
    return out or "0s"


def _duration(value: Any) -> int:
    if not isinstance(value, str):
        raise _Invalid(f'{DURATION_HINT} (a string: time_limit = "4h")')
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise _Invalid(DURATION_HINT) from None
    if seconds < 1:
        raise _Invalid("at least one second")
    return seconds


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid("a non-empty string")
    return value


def _memory(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid('a size in a string, e.g. "64G" or "512M"')
    return value  # the server parses it, for the CLI's flag and this key alike


def _window_policy(value: Any) -> str:
    if value not in WINDOW_POLICIES:
        raise _Invalid(" or ".join(repr(p) for p in WINDOW_POLICIES))
    return value


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _Invalid('a table of strings, e.g. env = { SEED = "1" }')
    return dict(value)


def _names(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Invalid('a list of [then.<name>] names, e.g. then = ["eval"]')
    return value


# Every key of [job], in the order the error lists them, and how its value is checked.
KEYS: dict[str, Callable[[Any], Any]] = {
    "entrypoint": _entrypoint,
    "nodes": _whole(1),
    "gpus": _whole(0),
    "gpu_type": _text,
    "cpus": _whole(1),
    "memory": _memory,
    "image": _text,
    "env": _env,
    "cluster": _text,
    "team": _text,
    "name": _text,
    "priority": _whole(None),
    "window": _text,
    "window_policy": _window_policy,
    "pending_deadline_s": _whole(1),
    "time_limit": _duration,  # seconds once checked: the API's time_limit_s
    "max_retries": _whole(0),
    "retry_cooldown_s": _whole(0),
    "then": _names,
}


def job_defaults(directory: str) -> dict[str, Any]:
    """The checked `[job]` table of `directory`/starforge.toml ({} without the file or table)."""
    path = os.path.join(directory, PROJECT_FILE)
    try:
        with open(path, "rb") as handle:
            project = tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProjectError(f"{PROJECT_FILE} is not valid TOML ({exc})") from exc
    except OSError as exc:
        raise ProjectError(f"cannot read {path}: {exc.strerror or exc}") from exc
    table = project.get("job", {})
    if not isinstance(table, dict):
        raise ProjectError(f"job in {PROJECT_FILE} must be a table: [job]")
    checked = {}
    for key, value in table.items():
        if key not in KEYS:
            raise ProjectError(
                f"[job] in {PROJECT_FILE} has no key {key!r}; its keys are {', '.join(KEYS)}"
            )
        try:
            checked[key] = KEYS[key](value)
        except _Invalid as exc:
            raise ProjectError(
                f"[job] {key} in {PROJECT_FILE} must be {exc}, not {value!r}"
            ) from None
    return checked
