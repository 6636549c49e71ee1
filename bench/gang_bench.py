"""Multi-node jobs on the local executor: from one rank's failure to every rank gone.

A 2-rank job is launched through the real local executor and runner (offline: no API to ship
to, so nothing but the supervision is measured). Rank 1 prints the moment it exits with code 3;
rank 0 prints its pid and would run for ten minutes. The clock runs from rank 1's exit to the
moment no process of rank 0 is left and the runner has written its exit record (what the
reconciler reads to end the attempt FAILED).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

RANKS = 2
RUNS = 5
CODE = (
    "import os, sys, time\n"
    "if os.environ['NODE_RANK'] == '1':\n"
    "    time.sleep(1.0); print('fail_at', time.time(), flush=True); sys.exit(3)\n"
    "print('pid', os.getpid(), flush=True); time.sleep(600)\n"
)


def local_rank_failure() -> dict:
    from django.conf import settings

    from jobs.executors.base import LaunchSpec
    from jobs.executors.local import LocalExecutor
    from jobs.models import Cluster

    settings.SF_API_URL = ""  # the runner runs offline: no shipping, only supervision
    cluster = Cluster.objects.create(name="bench-local", kind="local", settings={"run_as": "none"})
    executor = LocalExecutor(cluster)
    took = []
    for run in range(RUNS):
        name = f"sf-gangbench{run}-a1"
        spec = LaunchSpec(
            name=name,
            job_id=run + 1,
            run_id=f"gangbench{run}",
            attempt=1,
            total_gpus=0,
            nodes=RANKS,
            entrypoint=[sys.executable, "-c", CODE],
            env={"SF_ENTRYPOINT": json.dumps([sys.executable, "-c", CODE]), "SF_ATTEMPT": "1"},
        )
        executor.submit(spec)
        attempt_dir = executor.root / name
        took.append(_failure_to_gone(attempt_dir))
    return {
        "ranks": RANKS,
        "runs": RUNS,
        "median_s": round(statistics.median(took), 3),
        "max_s": round(max(took), 3),
    }


def _failure_to_gone(attempt_dir: Path, timeout: float = 60.0) -> float:
    """Seconds from rank 1's exit (its own clock) to rank 0 gone and exit.json written."""
    deadline = time.monotonic() + timeout
    fail_at = pid = None
    console = attempt_dir / "console.log"
    while time.monotonic() < deadline:
        text = console.read_text() if console.exists() else ""
        for line in text.splitlines():
            words = line.split()
            if "fail_at" in words:
                fail_at = float(words[-1])
            elif "pid" in words:
                pid = int(words[-1])
        if fail_at and pid and not _alive(pid) and (attempt_dir / "exit.json").exists():
            return time.time() - fail_at
        time.sleep(0.01)
    raise RuntimeError(f"the ranks of {attempt_dir.name} did not end within {timeout} s")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
