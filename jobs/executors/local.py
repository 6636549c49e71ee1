"""Local executor: each attempt is the job-side runner in its own process group on this host.

State lives on disk, not in memory, so it survives a worker restart: one directory per attempt
(named deterministically from run_id + attempt) holds `slots.json` (its GPU slots),
`proc.json` (the runner's pid) and `alive.lock`, which the runner holds locked for as long as it
lives; the runner writes `started.json` and `exit.json` there.
"""

import datetime as dt
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from functools import cache
from pathlib import Path
from typing import ClassVar

from django.conf import settings

from jobs.executors.base import (
    Capacity,
    LaunchError,
    LaunchSpec,
    Observation,
    check_int,
    check_known,
    epoch,
    file_lock,
)
from jobs.states import JobStatus

KILL_AFTER_S = 10.0
LIVENESS_LOCK = "alive.lock"


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

    @staticmethod
    def validate_settings(settings: dict) -> None:
        check_known(settings, {"gpu_slots", "max_jobs"})
        check_int(settings, "gpu_slots", minimum=0)
        check_int(settings, "max_jobs", minimum=1)

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.root = Path(settings.SF_LOCAL_STATE_DIR) / cluster.name
        self.root.mkdir(parents=True, exist_ok=True)

    # -- interface ---------------------------------------------------------------------------
    def submit(self, spec: LaunchSpec) -> str:
        with self._lock():
            attempt_dir = self.root / spec.name
            if _launched(attempt_dir):
                return spec.name  # launched before (perhaps by a worker that crashed): adopt
            if attempt_dir.exists():
                # A worker died after claiming the directory but before the runner started
                # (no runner holds its lock, none ever wrote proc.json): launch it now.
                shutil.rmtree(attempt_dir)
            slots = self._free_slots(spec.gpus)
            attempt_dir.mkdir(parents=True)
            _write_json(attempt_dir / "slots.json", {"gpus": slots})
            proc = self._spawn(spec, attempt_dir, slots)
            _write_json(
                attempt_dir / "proc.json",
                {"pid": proc.pid, "gpus": slots},
            )
        threading.Thread(target=proc.wait, daemon=True).start()  # reap; state is on disk
        return spec.name

    def find(self, name: str) -> str | None:
        return name if _launched(self.root / name) else None

    def poll(self, job_refs: list[str]) -> dict[str, Observation]:
        found = {}
        for ref in job_refs:
            attempt_dir = self.root / ref
            if attempt_dir.is_dir():
                found[ref] = self._observe(attempt_dir)
        return found

    def live(self) -> dict[str, Observation]:
        """Attempt dirs whose runner still holds its liveness lock."""
        return {
            d.name: Observation(self._observe(d).native_state, name=d.name)
            for d in sorted(self.root.iterdir())
            if d.is_dir() and _runner_alive(d)
        }

    def cancel(self, job_ref: str) -> None:
        attempt_dir = self.root / job_ref
        proc = _read_json(attempt_dir / "proc.json")
        if not proc or (attempt_dir / "exit.json").exists():
            return
        first = _read_json(attempt_dir / "cancel.json")
        if not first:
            _write_json(attempt_dir / "cancel.json", {"at": time.time()})
            if _runner_alive(attempt_dir):
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
    def _lock(self):
        return file_lock(self.root / ".lock")

    def _free_slots(self, wanted: int) -> list[int]:
        if wanted == 0:
            return []
        held = set()
        for attempt_dir in self.root.iterdir():
            if attempt_dir.is_dir() and _runner_alive(attempt_dir):
                held.update(_read_json(attempt_dir / "slots.json").get("gpus", []))
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
        env["SF_PROC_FILE"] = str(attempt_dir / "proc.json")
        # The runner inherits a locked descriptor and holds the lock as long as it lives: a
        # held lock means "a runner is alive here", whatever happened to the worker.
        lock = os.open(attempt_dir / LIVENESS_LOCK, os.O_CREAT | os.O_RDWR)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(attempt_dir / "runner.log", "ab") as out:
                return subprocess.Popen(
                    [python, "-m", "sf.runner"],
                    env=env,
                    cwd=attempt_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(lock,),
                )
        except OSError as exc:
            raise LaunchError(f"could not start the runner: {exc}", permanent=True) from exc
        finally:
            os.close(lock)

    def _observe(self, attempt_dir: Path) -> Observation:
        started = _read_json(attempt_dir / "started.json")
        start_time = epoch(started.get("started_at"))
        done = _read_json(attempt_dir / "exit.json")
        if done:
            return _exited(done, start_time)
        if _runner_alive(attempt_dir):
            state = "RUNNING" if started else "STARTING"
            return Observation(state, start_time=start_time)
        return Observation(
            "DIED",
            failure="lost",
            start_time=start_time,
            end_time=dt.datetime.now(dt.UTC),
            message="the runner process is gone and left no exit status",
        )


def _exited(done: dict, start_time: dt.datetime | None) -> Observation:
    code, reason = done.get("exit_code"), str(done.get("reason") or "")
    if isinstance(code, bool) or not isinstance(code, int):
        code = None  # the job's code can write here too: only an int is an exit code
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
        start_time=start_time or epoch(done.get("started_at")),
        end_time=epoch(done.get("ended_at")),
    )


@cache
def nvml_gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # no driver, no library: the executor falls back to virtual slots
        return 0


def _runner_alive(attempt_dir: Path) -> bool:
    """True while a runner holds the attempt's liveness lock (immune to pid reuse)."""
    try:
        handle = os.open(attempt_dir / LIVENESS_LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)  # closing also drops the lock if we just took it
    return False


def _launched(attempt_dir: Path) -> bool:
    """A runner was started here: it lives, or it recorded itself, or it finished."""
    return attempt_dir.is_dir() and (
        _runner_alive(attempt_dir)
        or (attempt_dir / "proc.json").exists()
        or (attempt_dir / "exit.json").exists()
    )


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
