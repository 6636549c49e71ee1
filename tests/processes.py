"""The processes of a job as this host sees them, whatever namespace they run in.

A sandboxed job (`sf.sandbox`) has a PID namespace of its own: the pid it prints is not the
host's. Its processes are found by their environment instead, which holds the run's id; the
runner's holds it too, with the runner's credential, which no process of the job ever has.
"""

from pathlib import Path

from sf.contract import RECORD_KEY_VAR


def job_processes(run_id: str) -> list[int]:
    """Host pids of the live (non-zombie) processes of the run's job, its ranks' nsenter
    included (they carry the rank's environment)."""
    mine, runner = f"SF_RUN_ID={run_id}".encode(), f"{RECORD_KEY_VAR}=".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mine in environ and not any(v.startswith(runner) for v in environ) and state != "Z":
            found.append(int(entry.name))
    return found
