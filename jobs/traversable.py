"""The way through to what a local job running under another uid must reach, opened once.

As root, the local executor runs each team's jobs under an unprivileged uid (`run_as`). That
uid must pass through every folder from / down to the interpreter it runs (and its standard
library, its site-packages, the `sf` client), to the executor's state folder and to the run
outputs. Python may live where others cannot pass (pyenv under root's home, mode 0700): the
README's first job then failed. `open_the_way` adds `o+x` to those folders and nothing else:
others may pass through, never list or write them. `manage.py runstack` calls it and says
what it opened; the local executor itself refuses a launch that finds the way still closed
(`jobs.executors.local`).
"""

import json
import os
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings

# What the interpreter a job runs reads from: its folders as the interpreter itself reports
# them (a venv's prefix, the base installation's, every folder on its path) and the `sf`
# package's, which an editable install keeps outside them.
_ASK_INTERPRETER = (
    "import importlib.util, json, os, sys\n"
    "sf = importlib.util.find_spec('sf')\n"
    "paths = [os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, *sys.path]\n"
    "paths += [os.path.dirname(sf.origin)] if sf and sf.origin else []\n"
    "print(json.dumps(paths))\n"
)


def open_the_way(targets: Iterable[Path]) -> list[Path]:
    """Add `o+x` to every folder from / down to each target that lacks it (a file's folder,
    where the target is a file; as far as it exists, where it does not). Never adds read or
    write. Returns the folders it changed, in the order it changed them."""
    opened: list[Path] = []
    for target in targets:
        for folder in reversed((target, *target.parents)):
            try:
                mode = folder.stat().st_mode
            except OSError:
                break  # not there (yet): nothing below it either
            if not stat.S_ISDIR(mode) or mode & stat.S_IXOTH:
                continue
            folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
            opened.append(folder)
    return opened


def interpreter_paths(python: str) -> list[Path]:
    """What a job started with `python` reads from, as that interpreter reports it, and the
    folder named on the job's PATH (a venv's bin/, which may hold only a link)."""
    asked = subprocess.run(
        [python, "-I", "-c", _ASK_INTERPRETER],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [Path(python).parent, *(Path(p) for p in json.loads(asked.stdout) if p)]


def local_job_paths(output_roots: Iterable[Path]) -> list[Path]:
    """Everything a local job under another uid must reach: the runner's interpreter, the
    executor's state folder under SF_VAR_DIR and the clusters' output roots."""
    from jobs.executors.local import runner_python

    return [
        *interpreter_paths(runner_python()),
        Path(settings.SF_LOCAL_STATE_DIR),
        *output_roots,
    ]


def open_for_local_jobs() -> list[Path]:
    """Open the way for the jobs of every local cluster that runs them under other uids
    (the server as root, `run_as` not `none`); returns the folders it opened."""
    from jobs.executors.local import trusts_jobs_like_the_server
    from jobs.models import Cluster

    if os.geteuid() != 0:
        return []  # jobs run as the server's own user: nothing to open
    roots = [
        Path(cluster.settings.get("output_root") or settings.SF_OUTPUT_ROOT)
        for cluster in Cluster.objects.filter(kind="local")
        if not trusts_jobs_like_the_server(cluster.settings)
    ]
    return open_the_way(local_job_paths(roots)) if roots else []
