"""Folders a job of another uid must pass through, when the tests run as root.

As root the local executor runs each team's jobs under an unprivileged uid (run_as "team"),
which must reach its attempt's folders, its run outputs and the interpreter. pytest makes its
temporary folders 0700 and this machine's interpreter may live under root's 0700 home, so the
suites open them as `make run` does (`jobs.traversable`): traversable by others (o+x), never
listable.
"""

import os
import sys
from pathlib import Path

from jobs.traversable import interpreter_paths, open_the_way


def let_jobs_through(path: Path) -> None:
    """chmod o+x every folder from / down to `path` (when running as root)."""
    if os.geteuid() == 0:
        open_the_way([path])


def let_jobs_reach_the_interpreter() -> None:
    """The interpreter, its standard library, its site-packages and the `sf` client."""
    if os.geteuid() == 0:
        open_the_way(interpreter_paths(sys.executable))
