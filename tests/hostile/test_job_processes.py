"""A job sees no process but its own (issue 47, point 1; the review's point 6).

Another team's running job was readable in /proc: its command line (entrypoint, parameters,
any credential passed as an argument). In its sandbox (`sf.sandbox`) a job's /proc lists its
own processes and the sandbox's three (bwrap as init, its anchor, pasta), nothing of the
host's.
"""

import json
import os
import sys

import pytest

from tests.factories import queued_job
from tests.local_jobs import finished, run_until, start, texts

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("local_jobs"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs the server to run as root"),
]

LIST_PROCESSES = """
import json, os
seen = {}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                seen[pid] = fh.read().replace(b"\\0", b" ").decode(errors="replace").strip()
        except OSError as exc:
            seen[pid] = type(exc).__name__
print(json.dumps({"me": os.getpid(), "seen": seen}), flush=True)
"""


def test_a_job_lists_only_its_own_processes(make_team, make_user, team, alice):
    audio = make_team("audio")
    bob = make_user("bob", audio)
    secret = "--api-key=hunter2-of-audio"
    theirs = queued_job(
        audio,
        bob,
        total_gpus=0,
        entrypoint=[sys.executable, "-c", "import time; time.sleep(60)", secret],
    )
    start(theirs)
    run_until(lambda: open_cmdline_contains(secret))
    mine = queued_job(team, alice, total_gpus=0, entrypoint=[sys.executable, "-c", LIST_PROCESSES])
    start(mine)
    run_until(lambda: finished(mine), timeout=60)
    listing = json.loads(texts(mine)[0])
    commands = listing["seen"]
    assert not any(secret in command for command in commands.values())
    assert commands.pop(str(listing["me"])).startswith(f"{sys.executable} -c ")
    sandbox = sorted(commands.values())  # nothing of the host's, of the runner's, of theirs
    assert len(sandbox) == 3, sandbox
    assert sandbox[0].startswith("bwrap ") and sandbox[1].startswith("pasta ")
    assert sandbox[2] == "sleep infinity"


def open_cmdline_contains(text: str) -> bool:
    """The other team's job is up: its command line is on the host (where the test looks)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if text.encode() in fh.read():
                    return True
        except OSError:
            continue
    return False
