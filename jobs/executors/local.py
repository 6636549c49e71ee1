"""Local executor: each attempt is the job-side runner in its own process group on this host.

State lives on disk, not in memory, so it survives a worker restart: one directory per attempt
(named deterministically from run_id + attempt) holds `slots.json` (its GPU slots),
`cancel.json` (when a stop was first sent) and the runner's files of `sf.contract`: `proc.json`
(the runner's pid) and `alive.lock`, which the runner holds locked for as long as it lives; the
runner writes `started.json` and `exit.json` there, signed with the attempt's record key. While
the runner holds its lock the attempt is alive whatever any file says; once it is gone only a
record the runner signed decides the outcome (docs/ARCHITECTURE.md, invariant 7).

A poll only looks. A runner that died under its job leaves the job's processes unsupervised: the
poll reports the attempt RUNNING, marked `orphaned_group`, and `reap_stale` (the reconciler,
after the poll) kills them; the attempt ends at the next poll that finds them gone.

A job's environment is an allow-list (invariant 8): the runner starts from `base_env`, the SF_*
contract and its own files, never from the worker's environment, and applies the job's own
variables (SF_USER_ENV) to the job alone. With `run_as` (the default when the server runs as
root) the runner stays root and starts the job under an unprivileged uid: each team its own
(`uid_base` + team id), or one named account. The attempt dir is then root's (0711) and only
`work/` (the run dir and HOME), `tmp/`, `metrics/` and the run's output dir are the job's (0700).
"""

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from functools import cache
from pathlib import Path
from typing import ClassVar

import psutil
from django.conf import settings
from sf.contract import (
    API_URL_VAR,
    ARRAY_VARS,
    BOOTSTRAP_TOKEN_VAR,
    ENTRYPOINT_VAR,
    EXIT_FILE,
    GPUS_PER_NODE_VAR,
    INGEST_FAILED,
    JOB_TOKEN_VAR,
    JOB_VARS,
    LIVENESS_LOCK,
    NICENESS_VAR,
    NUM_NODES_VAR,
    PARENT_PREFIX,
    PREEMPT_GRACE_VAR,
    PROC_FILE,
    RANK_GPUS_VAR,
    RANK_LAUNCH_VAR,
    RECORD_KEY_VAR,
    RUN_AS_GID_VAR,
    RUN_AS_UID_VAR,
    RUN_AS_USER_VAR,
    RUN_DIR,
    SANDBOX_VAR,
    SNAPSHOT_VAR,
    STARTED_FILE,
    STOP_GRACE_VAR,
    USER_ENV_VAR,
    Failure,
    file_env,
    read_json,
)

from jobs.executors import sandbox
from jobs.executors.base import (
    DEFAULT_PATH,
    Capacity,
    LaunchError,
    LaunchSpec,
    NodeCapacity,
    Observation,
    base_env,
    check_int,
    check_known,
    epoch,
    file_lock,
    rank_details,
    read_record,
    record_key,
)
from jobs.priority import job_niceness
from jobs.states import JobStatus

KILL_AFTER_S = 15.0  # past the runner's own grace (10 s), so it normally ends its job itself
# The executor's own files in the attempt dir, beside the runner's (sf.contract).
SLOTS_FILE = "slots.json"  # the GPU slots the attempt holds
CANCEL_FILE = "cancel.json"  # when the first SIGTERM was sent: SIGKILL follows KILL_AFTER_S later
RUNNER_LOG = "runner.log"  # the runner's own stdout and stderr
# An observation's detail: the process group of a job whose runner died under it (reap_stale).
ORPHANED_GROUP = "orphaned_group"
DEFAULT_UID_BASE = 200_000
MIN_UID_BASE = 1000
NO_RUN_AS = ("", "none")
# The SF_* names the launcher hands the runner; anything else in a spec's env is the job's own
# (when the launcher did not set SF_USER_ENV itself).
CONTRACT = frozenset(
    {
        *JOB_VARS,
        ENTRYPOINT_VAR,
        SNAPSHOT_VAR,
        API_URL_VAR,
        PREEMPT_GRACE_VAR,
        STOP_GRACE_VAR,
        JOB_TOKEN_VAR,
        BOOTSTRAP_TOKEN_VAR,
        *ARRAY_VARS,
    }
)
# Files of the attempt dir only the server's side writes or reads: never the job's.
PRIVATE_MODE = 0o600


@dataclasses.dataclass(frozen=True)
class JobIdentity:
    """The unix account a job runs as, when it is not the server's."""

    uid: int
    gid: int
    user: str


class LocalExecutor:
    PREEMPT_BY_TERM: ClassVar[bool] = False  # the runner alone gets SIGUSR1
    STATE_TABLE: ClassVar[dict[str, JobStatus]] = {
        "STARTING": JobStatus.PENDING,  # runner up, fetching/unpacking the snapshot
        "RUNNING": JobStatus.RUNNING,  # entrypoint spawned (started.json written)
        "SUCCEEDED": JobStatus.SUCCEEDED,  # signed exit.json with exit code 0
        "FAILED": JobStatus.FAILED,  # signed exit.json with a non-zero exit code
        "KILLED": JobStatus.FAILED,  # entrypoint killed by a signal
        "INGEST_FAILED": JobStatus.FAILED,  # runner could not fetch/unpack the snapshot
        "DIED": JobStatus.FAILED,  # runner gone without a signed exit.json
    }

    @staticmethod
    def validate_settings(settings: dict) -> None:
        check_known(
            settings, {"gpu_slots", "gpu_type", "max_jobs", "run_as", "sandbox", "uid_base"}
        )
        sandbox.check_setting(settings)
        gpu_type = settings.get("gpu_type")
        if gpu_type is not None and (not isinstance(gpu_type, str) or not gpu_type.strip()):
            raise ValueError("gpu_type must be a non-empty string (the type of the GPU slots)")
        check_int(settings, "gpu_slots", minimum=0)
        check_int(settings, "max_jobs", minimum=1)
        check_int(settings, "uid_base", minimum=MIN_UID_BASE)
        run_as = settings.get("run_as")
        if run_as is None or run_as in NO_RUN_AS or run_as == "team":
            return
        if not isinstance(run_as, str):
            raise ValueError(f"run_as must be a user name, 'team' or 'none', not {run_as!r}")
        try:
            account = pwd.getpwnam(run_as)
        except KeyError:
            raise ValueError(
                f"run_as names user {run_as!r}, which this host does not have"
            ) from None
        if account.pw_uid == 0:
            raise ValueError("run_as must be an unprivileged account, not one with uid 0")

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
            identity = job_identity(self.cluster.settings, spec)
            confine = None
            if identity:
                self._open_to(identity)
                if sandbox.wanted(self.cluster.settings):
                    confine = sandbox.prepare_launch(self.cluster.name)
            slots = self._free_slots(spec.total_gpus)
            attempt_dir.mkdir(parents=True)
            attempt_dir.chmod(0o711)  # the job may pass through to work/, not list or write
            _write_json(attempt_dir / SLOTS_FILE, {"gpus": slots})
            proc = self._spawn(spec, attempt_dir, slots, identity, confine)
            _write_json(attempt_dir / PROC_FILE, {"pid": proc.pid, "gpus": slots})
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

    def reap_stale(self, observations: dict[str, Observation]) -> list[str]:
        """SIGKILL the processes of each job a poll found orphaned (`orphaned_group`): its
        runner died under it, so nothing supervises them, and the attempt closes only once they
        are gone. The group is found again from the runner's signed start record, not taken
        from the observation. Returns the refs whose processes were signalled."""
        reaped = []
        for ref, obs in observations.items():
            if not obs.details.get(ORPHANED_GROUP):
                continue
            attempt_dir = self.root / ref
            if not _runner_alive(attempt_dir) and self._kill_orphans(attempt_dir):
                reaped.append(ref)
        return reaped

    def starforge_objects(self) -> dict[str, Observation]:
        """Attempt dirs whose runner still holds its liveness lock."""
        return {
            d.name: Observation(self._observe(d).native_state, name=d.name)
            for d in sorted(self.root.iterdir())
            if d.is_dir() and _runner_alive(d)
        }

    def cancel(self, job_ref: str) -> None:
        """SIGTERM the runner (it ends every process of the job, then writes its exit record);
        past KILL_AFTER_S, SIGKILL every process the runner still has below it, then it.

        Whatever exit.json says: job code may have written it while it keeps running."""
        attempt_dir = self.root / job_ref
        proc = read_json(attempt_dir / PROC_FILE)
        if not proc:
            return
        if not _runner_alive(attempt_dir):
            self._kill_orphans(attempt_dir)
            return
        first = read_json(attempt_dir / CANCEL_FILE)
        if not first or (first.get("preempted") and first["at"] > time.time()):
            # A stop during a preemption's grace cuts it short: the runner's SIGKILL comes a
            # stop's grace after this SIGTERM.
            _write_json(attempt_dir / CANCEL_FILE, {"at": time.time()})
            _signal_group(proc["pid"], signal.SIGTERM)
        elif time.time() - first["at"] > KILL_AFTER_S:
            kill_tree(proc["pid"])

    def preempt(self, job_ref: str, grace_s: int) -> None:
        """SIGUSR1 to the runner alone: it writes the job's notice file, sends the job SIGTERM
        and SIGKILL `grace_s` later. A cancel after the grace (the reconciler's) escalates as a
        stop's does, counted from the grace's end."""
        attempt_dir = self.root / job_ref
        proc = read_json(attempt_dir / PROC_FILE)
        if not proc or not _runner_alive(attempt_dir) or read_json(attempt_dir / CANCEL_FILE):
            return  # gone, or a stop is on its way already
        _write_json(attempt_dir / CANCEL_FILE, {"at": time.time() + grace_s, "preempted": True})
        _signal_group(proc["pid"], signal.SIGUSR1)

    def capacity(self) -> Capacity:
        """The host as one node: its NVIDIA GPUs (typed by NVML's device name), else the
        virtual slots of `gpu_slots` (typed by the `gpu_type` setting, if any). The ranks of a
        multi-node job share it, each with slots of its own."""
        max_jobs = self.cluster.settings.get("max_jobs")
        count = nvml_gpu_count()
        virtual = not count
        if virtual:
            count = int(self.cluster.settings.get("gpu_slots", settings.SF_LOCAL_GPU_SLOTS))
            kind = str(self.cluster.settings.get("gpu_type", ""))
        else:
            kind = nvml_gpu_type()
        node = NodeCapacity(socket.gethostname(), count, kind)
        return Capacity(
            True, count, max_jobs, virtual=virtual, nodes=(node,), ranks_share_nodes=True
        )

    # -- helpers -----------------------------------------------------------------------------
    def _lock(self):
        return file_lock(self.root / ".lock")

    def _free_slots(self, wanted: int) -> list[int]:
        if wanted == 0:
            return []
        held = set()
        for attempt_dir in self.root.iterdir():
            if attempt_dir.is_dir() and _runner_alive(attempt_dir):
                held.update(read_json(attempt_dir / SLOTS_FILE).get("gpus", []))
        free = [s for s in range(self.capacity().total_gpus) if s not in held]
        if len(free) < wanted:
            raise LaunchError(
                f"{len(free)} GPU slots free on {self.cluster.name}, {wanted} needed",
                permanent=False,
            )
        return free[:wanted]

    def _open_to(self, identity: JobIdentity) -> None:
        """Let a job of another uid reach its own directories, and nothing else of ours."""
        output_root = Path(self.cluster.settings.get("output_root") or settings.SF_OUTPUT_ROOT)
        output_root.mkdir(parents=True, exist_ok=True)
        for folder in (Path(settings.SF_LOCAL_STATE_DIR), self.root, output_root):
            folder.chmod(0o711)  # traversable, not listable
        close_var_dir(Path(settings.SF_VAR_DIR), {Path(settings.SF_LOCAL_STATE_DIR), output_root})
        python = Path(os.path.realpath(runner_python()))
        for target in (self.root, output_root, python.parent):
            blocked = not_traversable(target)
            if blocked:
                raise LaunchError(
                    f"jobs on {self.cluster.name} run as uid {identity.uid}, which cannot reach "
                    f"{target}: {blocked} is mode {stat.S_IMODE(blocked.stat().st_mode):o}; "
                    "make it traversable (chmod o+x) or set run_as",
                    permanent=True,
                )

    def _spawn(
        self,
        spec: LaunchSpec,
        attempt_dir: Path,
        slots: list[int],
        identity: "JobIdentity | None",
        confine: dict | None = None,
    ) -> subprocess.Popen:
        python = runner_python()
        env = runner_env(spec, attempt_dir, identity, python)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slots))
        if confine is not None:
            env[SANDBOX_VAR] = json.dumps(confine)  # the runner builds it (sf.sandbox)
        niceness = job_niceness()
        if niceness is not None:
            env[NICENESS_VAR] = str(niceness)  # not the worker's lowered priority (SF_WORKER_NICE)
        if spec.nodes > 1:
            # The runner starts the ranks as process groups here, each with its own slots.
            per = spec.gpus_per_node
            env[RANK_LAUNCH_VAR] = "local"
            env[NUM_NODES_VAR] = str(spec.nodes)
            env[GPUS_PER_NODE_VAR] = str(per)
            env[RANK_GPUS_VAR] = json.dumps(
                [",".join(map(str, slots[r * per : (r + 1) * per])) for r in range(spec.nodes)]
            )
        # The runner inherits a locked descriptor and holds the lock as long as it lives: a
        # held lock means "a runner is alive here", whatever happened to the worker.
        lock = os.open(attempt_dir / LIVENESS_LOCK, os.O_CREAT | os.O_RDWR, PRIVATE_MODE)
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = os.open(attempt_dir / RUNNER_LOG, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        try:
            # -I: no PYTHON* variable, user site or working directory decides what it imports.
            return subprocess.Popen(
                [python, "-I", "-m", "sf.runner"],
                env=env,
                cwd=attempt_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(lock,),
            )
        except OSError as exc:
            raise LaunchError(f"could not start the runner: {exc}", permanent=True) from exc
        finally:
            os.close(lock)
            os.close(log)

    def _observe(self, attempt_dir: Path) -> Observation:
        """The attempt as its files and processes show it; changes nothing (see `reap_stale`)."""
        name = attempt_dir.name
        started = read_record(attempt_dir / STARTED_FILE, name)
        start_time = epoch(started.get("started_at"))
        if _runner_alive(attempt_dir):
            # Whatever exit.json says: job code may have written one and kept running.
            return Observation(
                "RUNNING" if started else "STARTING",
                start_time=start_time,
                details=rank_details(started),
            )
        done = read_record(attempt_dir / EXIT_FILE, name)
        if done:
            return _exited(done, start_time)
        group = _orphaned_group(started)
        if group is not None:
            # The runner died under its job: nothing supervises what is left. The attempt stays
            # open until it is gone; ending it is `reap_stale`'s, after the poll.
            details = {ORPHANED_GROUP: group}
            return Observation("RUNNING", start_time=start_time, details=details)
        return Observation(
            "DIED",
            failure=Failure.LOST,
            start_time=start_time,
            end_time=dt.datetime.now(dt.UTC),
            message="the runner is gone and left no exit status it signed",
        )

    def _kill_orphans(self, attempt_dir: Path) -> bool:
        """SIGKILL the process groups of the job's entrypoint (one per rank, from the runner's
        signed start record) once its runner is gone; True while any process of them was
        still there."""
        started = read_record(attempt_dir / STARTED_FILE, attempt_dir.name)
        alive = [pgid for pgid in _job_groups(started) if _group_alive(pgid)]
        for pgid in alive:
            _signal_group(pgid, signal.SIGKILL)
        return bool(alive)


def _job_groups(started: dict) -> list[int]:
    """The process groups of the job's ranks in the runner's signed start record."""
    groups = started.get("pids")
    if not isinstance(groups, list):
        groups = [started.get("pid")]
    return [g for g in groups if isinstance(g, int) and not isinstance(g, bool) and g > 1]


def _orphaned_group(started: dict) -> int | None:
    """A process group of the job's entrypoint (one per rank, from the runner's signed start
    record) while any process of it is still there, else None; the caller knows the runner
    is gone."""
    return next((pgid for pgid in _job_groups(started) if _group_alive(pgid)), None)


def job_identity(cluster_settings: dict, spec: LaunchSpec) -> JobIdentity | None:
    """Whom the job runs as: None for the server's own user (run_as "" or "none", or unset
    while the server is not root); else a team's uid or the named account."""
    mode = cluster_settings.get("run_as")
    if mode is None:
        mode = "team" if os.geteuid() == 0 else ""
    if mode in NO_RUN_AS:
        return None
    if os.geteuid() != 0:
        raise LaunchError(
            f"run_as {mode!r} needs the server to run as root: it starts jobs as another user",
            permanent=True,
        )
    if mode == "team":
        if not spec.team_id:
            raise LaunchError("run_as 'team' needs the job's team id", permanent=True)
        uid = int(cluster_settings.get("uid_base", DEFAULT_UID_BASE)) + spec.team_id
        return JobIdentity(uid, uid, f"sf-team-{spec.team_id}")
    try:
        account = pwd.getpwnam(mode)
    except KeyError:
        raise LaunchError(f"run_as user {mode!r} does not exist here", permanent=True) from None
    return JobIdentity(account.pw_uid, account.pw_gid, mode)


def trusts_jobs_like_the_server(cluster_settings: dict) -> bool:
    """True when the cluster's jobs run as the server's own unix user (no run_as)."""
    mode = cluster_settings.get("run_as")
    return mode in NO_RUN_AS or (mode is None and os.geteuid() != 0)


def runner_python() -> str:
    return settings.SF_RUNNER_PYTHON or sys.executable


def runner_env(
    spec: LaunchSpec, attempt_dir: Path, identity: JobIdentity | None, python: str
) -> dict[str, str]:
    """The runner's whole environment, from an allow-list: never the worker's own.

    The job's variables travel as SF_USER_ENV only; the runner applies them to the job."""
    work = attempt_dir / RUN_DIR
    if identity:
        home, user = str(work), identity.user
    else:
        account = pwd.getpwuid(os.geteuid())
        home, user = account.pw_dir, account.pw_name
    # Jobs run in the server's Python environment: `python train.py` means this interpreter
    # even on machines where only `python3` is on the PATH.
    path = os.pathsep.join([str(Path(python).parent), DEFAULT_PATH])
    env = base_env(home, str(attempt_dir / "tmp"), path)
    env.update({"USER": user, "LOGNAME": user})
    env.update({k: v for k, v in spec.env.items() if k in CONTRACT or k.startswith(PARENT_PREFIX)})
    env[USER_ENV_VAR] = json.dumps(user_env(spec.env))
    env[RECORD_KEY_VAR] = record_key(spec.name)
    env.update(file_env(attempt_dir, proc_file=True))
    if identity:
        env.update(
            {
                RUN_AS_UID_VAR: str(identity.uid),
                RUN_AS_GID_VAR: str(identity.gid),
                RUN_AS_USER_VAR: identity.user,
            }
        )
    return env


def user_env(env: dict[str, str]) -> dict[str, str]:
    """The job's own variables: SF_USER_ENV as the launcher wrote it, else what is not ours."""
    raw = env.get(USER_ENV_VAR)
    if raw is not None:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise LaunchError(f"{USER_ENV_VAR} is not a JSON object", permanent=True)
        return {str(k): str(v) for k, v in parsed.items()}
    return {
        k: v
        for k, v in env.items()
        if k not in CONTRACT and not k.startswith(PARENT_PREFIX) and k != RECORD_KEY_VAR
    }


def close_var_dir(var_dir: Path, keep: set[Path]) -> None:
    """Leave SF_VAR_DIR traversable but take every other user's access to what it holds
    (ledger file, secret key, snapshots, logs), but for the folders jobs must pass through."""
    var_dir = var_dir.resolve()
    state_paths = {p.resolve() for p in keep}
    if not any(var_dir in p.parents for p in state_paths):
        return  # the job's folders are elsewhere: SF_VAR_DIR need not be traversable at all
    var_dir.chmod(0o711)
    on_the_way = {p for path in state_paths for p in (path, *path.parents)}
    for entry in var_dir.iterdir():
        try:
            mode = entry.lstat().st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode) or entry.resolve() in on_the_way:
            continue
        if stat.S_IMODE(mode) & 0o077:
            entry.chmod(stat.S_IMODE(mode) & ~0o077)


def not_traversable(path: Path) -> Path | None:
    """The first folder from / down to `path` that others may not pass through, if any."""
    for folder in reversed((path, *path.parents)):
        try:
            mode = folder.stat().st_mode
        except OSError:
            return folder
        if not mode & stat.S_IXOTH:
            return folder
    return None


def _exited(done: dict, start_time: dt.datetime | None) -> Observation:
    code, reason = done.get("exit_code"), str(done.get("reason") or "")
    if isinstance(code, bool) or not isinstance(code, int):
        code = None  # only an int is an exit code
    failure: str  # a Failure; "" for a success
    if reason.startswith(INGEST_FAILED):
        state, failure = "INGEST_FAILED", Failure.INGEST
    elif code == 0:
        state, failure = "SUCCEEDED", ""
    elif code is not None and code < 0:
        state, failure = "KILLED", Failure.EXIT
    else:
        state, failure = "FAILED", Failure.EXIT
    return Observation(
        state,
        failure=failure,
        exit_code=code,
        message=reason,
        start_time=start_time or epoch(done.get("started_at")),
        end_time=epoch(done.get("ended_at")),
        details=rank_details(done),
    )


@cache
def nvml_gpu_type() -> str:
    """NVML's name of the host's first GPU (e.g. "NVIDIA A100-SXM4-80GB"); "" without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no driver, no library: untyped virtual slots
        return ""


@cache
def nvml_gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # no driver, no library: the executor falls back to virtual slots
        return 0


def _runner_alive(attempt_dir: Path) -> bool:
    """True while a runner holds the attempt's liveness lock (immune to pid reuse).

    The probe is a shared lock: it is refused only while the runner holds its exclusive one,
    and two observers probing at once cannot take each other for a live runner."""
    try:
        handle = os.open(attempt_dir / LIVENESS_LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)  # closing also drops the lock if we just took it
    return False


def _launched(attempt_dir: Path) -> bool:
    """A runner was started here: it lives, or it recorded itself, or it finished."""
    return attempt_dir.is_dir() and (
        _runner_alive(attempt_dir)
        or (attempt_dir / PROC_FILE).exists()
        or (attempt_dir / EXIT_FILE).exists()
    )


def descendants(pid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes below `pid`. The runner is a child subreaper, so whatever
    its job forked, even through setsid and a double fork, stays below it while it lives."""
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in below if _alive(p)]


def kill_tree(pid: int, rounds: int = 50) -> None:
    """SIGKILL everything below the runner `pid`, again until nothing is left (a process may
    fork while we look), then the runner itself."""
    for _ in range(rounds):
        below = descendants(pid)
        if not below:
            break
        for child in below:
            with contextlib.suppress(psutil.Error):
                child.kill()
        time.sleep(0.01)
    _signal_group(pid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == pgid and _alive(process):
                return True
    return False


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.chmod(PRIVATE_MODE)
    os.replace(tmp, path)
