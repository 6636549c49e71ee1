"""Folders a job of another uid must pass through, when the tests run as root.

As root the local executor runs each team's jobs under an unprivileged uid (run_as "team"),
which must reach its attempt's folders, its run outputs and the interpreter. pytest makes its
temporary folders 0700 and this machine's interpreter may live under root's 0700 home, so the
suites open them as `make run` does (`jobs.traversable`): traversable by others (o+x), never
listable. And the way a test runs a command as such a job's uid, with a Python of its own
under a closed home as pyenv installs one.
"""

import os
import subprocess
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


JOB_UID = 200_977  # an unprivileged uid no account has, as run_as "team" gives


def as_job(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        user=JOB_UID,
        group=JOB_UID,
        extra_groups=[],
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def python_in_a_closed_home(home: Path) -> Path:
    """A Python of its own (a venv with copies, the `sf` client on its path) in `home`, 0700."""
    home.mkdir()
    venv = home / ".pyenv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--copies", "--without-pip", str(venv)],
        check=True,
        umask=0o022,  # installed as an operator's shell installs it
    )
    client = Path(__file__).resolve().parents[1] / "client"
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "sf-client.pth").write_text(f"{client}\n")
    (site / "sf-client.pth").chmod(0o644)
    home.chmod(0o700)
    return venv / "bin" / "python"
