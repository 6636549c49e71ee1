"""Server processes make everything under SF_VAR_DIR private from the first write (issue 47,
point 11). On a fresh install `var/logs` was 0755 with 0644 files, and the ledger 0644, until
the local executor's first launch closed SF_VAR_DIR: meanwhile any local user could read them.
The folders a local job under another uid passes through are opened, 0711, by the executor
itself at launch (tests/e2e/test_first_job_as_root.py)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A fresh install's first steps: the ledger made, the demo user, a job whose first log lines
# arrive (logs/ is made then), a snapshot kept.
FIRST_WRITES = """
import io, tarfile
from django.contrib.auth.models import User
from django.core.management import call_command
call_command("migrate", verbosity=0)
from jobs.bootstrap import ensure_demo
from jobs.models import Team
from jobs.stores import logstore
from jobs.stores.snapshots import store_snapshot
from tests.factories import queued_job, with_attempt
ensure_demo()
team, user = Team.objects.get(name="demo"), User.objects.get(username="demo")
job = queued_job(team, user)
with_attempt(job, "RUNNING")
logstore.append(job.pk, 1, [{"seq": 0, "stream": "stdout", "ts": 1.0, "text": "step 1"}])
archive = io.BytesIO()
with tarfile.open(fileobj=archive, mode="w:gz") as tar:
    data = b"print('hi')\\n"
    member = tarfile.TarInfo("train.py")
    member.size = len(data)
    tar.addfile(member, io.BytesIO(data))
archive.seek(0)
store_snapshot(archive, "application/gzip", None, team=team, user=user)
"""


def open_to_others(var: Path) -> list[str]:
    """Every path under `var` (itself included) that its group or others may use at all."""
    found = []
    for path in [var, *sorted(var.rglob("*"))]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found.append(f"{path.relative_to(var.parent)} {mode:o}")
    return found


def test_a_fresh_installation_writes_nothing_others_can_read(tmp_path):
    var = tmp_path / "var"
    base = {k: v for k, v in os.environ.items() if not k.startswith("SF_")}
    base.pop("DATABASE_URL", None)  # the embedded ledger, a file in SF_VAR_DIR
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", FIRST_WRITES],
        cwd=ROOT,
        env={**base, "SF_VAR_DIR": str(var)},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o022),  # the operator's shell's, as usual
    )
    assert done.returncode == 0, done.stderr
    assert list(var.glob("logs/**/*.log")) and list(var.glob("snapshots/**/*"))
    assert (var / "starforge.sqlite3").exists()
    assert open_to_others(var) == []
