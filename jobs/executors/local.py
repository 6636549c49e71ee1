"""Local executor: each attempt is the job-side runner in its own process group on this host.

State lives on disk, not in memory, so it survives a worker restart: one directory per attempt
(named deterministically from run_id + attempt) holds `proc.json` (pid, kernel start time,
GPU slots), and the runner writes `started.json` and `exit.json` there.
"""

import datetime as dt
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import ClassVar

from django.conf import settings

from jobs.executors.base import Capacity, LaunchError, LaunchSpec, Observation
from jobs.states import JobStatus

KILL_AFTER_S = 10.0


class LocalExecutor:
    STATE_TABLE: ClassVar[dict[str, JobStatus]] = {
        "STARTING": JobStatus.PENDING,  # runner up, fetching/unpacking the snapshot
        "RUNNING": JobStatus.RUNNING,  # entrypoint spawned (started.json written)
        "SUCCEEDED": JobStatus.SUCCEEDED,  # exit.json with exit code 0
        "FAILED": JobStatus.FAILED,  # exit.json with a non-zero exit code
        "KILLED": JobStatus.FAILED,  # entrypoint killed by a signal
        "INGEST_FAILED": JobStatus.FAILED,  # runner could not fetch/unpack the snapshot
        "DIED": JobStatus.FAILED,  # runner gone without writing exit.json
    }

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.root = Path(settings.SF_LOCAL_STATE_DIR) / cluster.name
        self.root.mkdir(parents=True, exist_ok=True)

    # -- interface ---------------------------------------------------------------------------
    def submit(self, spec: LaunchSpec) -> str:
        with self._lock():
            attempt_dir = self.root / spec.name
            if attempt_dir.exists():
                return spec.name  # launched before (perhaps by a worker that crashed): adopt
            slots = self._free_slots(spec.gpus)
            attempt_dir.mkdir(parents=True)
            proc = self._spawn(spec, attempt_dir, slots)
            _write_json(
                attempt_dir / "proc.json",
                {
                    "pid": proc.pid,
                    "start_ticks": _start_ticks(proc.pid),
                    "gpus": slots,
                    "launched_at": time.time(),
                },
            )
        threading.Thread(target=proc.wait, daemon=True).start()  # reap; state is on disk
        return spec.name

    def find(self, name: str) -> str | None:
        return name if (self.root / name).exists() else None

    def poll(self, job_refs: list[str]) -> dict[str, Observation]:
        found = {}
        for ref in job_refs:
            attempt_dir = self.root / ref
            if attempt_dir.is_dir():
                found[ref] = self._observe(attempt_dir)
        return found

    def cancel(self, job_ref: str) -> None:
        attempt_dir = self.root / job_ref
        proc = _read_json(attempt_dir / "proc.json")
        if not proc or (attempt_dir / "exit.json").exists():
            return
        first = _read_json(attempt_dir / "cancel.json")
        if not first:
            _write_json(attempt_dir / "cancel.json", {"at": time.time()})
            _signal_group(proc["pid"], signal.SIGTERM)
        elif time.time() - first["at"] > KILL_AFTER_S:
            started = _read_json(attempt_dir / "started.json")
            for pid in (proc["pid"], started.get("pid")):
                if pid:
                    _signal_group(pid, signal.SIGKILL)

    def capacity(self) -> Capacity:
        count = nvml_gpu_count()
        if count:
            return Capacity(True, count, self.cluster.settings.get("max_jobs"))
        slots = int(self.cluster.settings.get("gpu_slots", settings.SF_LOCAL_GPU_SLOTS))
        return Capacity(True, slots, self.cluster.settings.get("max_jobs"), virtual=True)

    # -- helpers -----------------------------------------------------------------------------
    @contextmanager
    def _lock(self):
        with open(self.root / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _free_slots(self, wanted: int) -> list[int]:
        if wanted == 0:
            return []
        held = set()
        for attempt_dir in self.root.iterdir():
            proc = _read_json(attempt_dir / "proc.json") if attempt_dir.is_dir() else {}
            if proc and _alive(proc) and not (attempt_dir / "exit.json").exists():
                held.update(proc.get("gpus", []))
        free = [s for s in range(self.capacity().total_gpus) if s not in held]
        if len(free) < wanted:
            raise LaunchError(
                f"{len(free)} GPU slots free on {self.cluster.name}, {wanted} needed",
                permanent=False,
            )
        return free[:wanted]

    def _spawn(self, spec: LaunchSpec, attempt_dir: Path, slots: list[int]) -> subprocess.Popen:
        env = {**os.environ, **spec.env}
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, slots)),
                "SF_EXIT_FILE": str(attempt_dir / "exit.json"),
                "SF_STARTED_FILE": str(attempt_dir / "started.json"),
                "SF_RUN_DIR": str(attempt_dir / "work"),
            }
        )
        python = settings.SF_RUNNER_PYTHON or sys.executable
        # Jobs run in the server's Python environment: `python train.py` means this
        # interpreter even on machines where only `python3` is on the PATH.
        env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
        with open(attempt_dir / "runner.log", "ab") as out:
            try:
                return subprocess.Popen(
                    [python, "-m", "sf.runner"],
                    env=env,
                    cwd=attempt_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise LaunchError(f"could not start the runner: {exc}", permanent=True) from exc

    def _observe(self, attempt_dir: Path) -> Observation:
        proc = _read_json(attempt_dir / "proc.json")
        started = _read_json(attempt_dir / "started.json")
        start_time = _ts(started.get("started_at"))
        done = _read_json(attempt_dir / "exit.json")
        if done:
            return _exited(done, start_time)
        if proc and _alive(proc):
            state = "RUNNING" if started else "STARTING"
            return Observation(state, start_time=start_time, details={"pid": proc["pid"]})
        if not proc and time.time() - attempt_dir.stat().st_mtime < 30:
            return Observation("STARTING")  # directory claimed, launch still being recorded
        return Observation(
            "DIED",
            failure="lost",
            start_time=start_time,
            end_time=dt.datetime.now(dt.UTC),
            message="the runner process is gone and left no exit status",
        )


def _exited(done: dict, start_time: dt.datetime | None) -> Observation:
    code, reason = done.get("exit_code"), done.get("reason", "")
    if reason.startswith("ingest failed"):
        state, failure = "INGEST_FAILED", "ingest"
    elif code == 0:
        state, failure = "SUCCEEDED", ""
    elif code is not None and code < 0:
        state, failure = "KILLED", "exit"
    else:
        state, failure = "FAILED", "exit"
    return Observation(
        state,
        failure=failure,
        exit_code=code,
        message=reason,
        start_time=start_time or _ts(done.get("started_at")),
        end_time=_ts(done.get("ended_at")),
    )


@cache
def nvml_gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # no driver, no library: the executor falls back to virtual slots
        return 0


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19]) if fields[0] != "Z" else None


def _alive(proc: dict) -> bool:
    """True when the recorded pid still runs and is the same process (not a reused pid)."""
    ticks = _start_ticks(proc["pid"])
    return ticks is not None and ticks == proc.get("start_ticks")


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _ts(value) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(value, dt.UTC) if value else None
