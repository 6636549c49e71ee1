"""Folders a job of another uid must pass through, when the tests run as root.

As root the local executor runs each team's jobs under an unprivileged uid (run_as "team"),
which must reach its attempt's folders, its run outputs and the interpreter. pytest makes its
temporary folders 0700 and this machine's interpreter may live under root's 0700 home, so the
suites open them the way an operator would: traversable by others (o+x), never listable.
"""

import os
import stat
import sys
from pathlib import Path


def let_jobs_through(path: Path) -> None:
    """chmod o+x every folder from / down to `path` (when running as root)."""
    if os.geteuid() != 0:
        return
    for folder in reversed((path, *path.parents)):
        mode = stat.S_IMODE(folder.stat().st_mode)
        if not mode & stat.S_IXOTH:
            folder.chmod(mode | stat.S_IXOTH)


def interpreter_dir() -> Path:
    return Path(os.path.realpath(sys.executable)).parent


def let_jobs_reach_the_interpreter() -> None:
    """The interpreter, its standard library and this checkout (the `sf` client, editable)."""
    let_jobs_through(interpreter_dir())
    let_jobs_through(Path(os.path.realpath(sys.prefix)))
    let_jobs_through(Path(__file__).resolve().parents[1])
