"""Owns the runner's environment and the job's: the SF_* contract read into `RunnerEnv`
(where the attempt's files and the job's folders are, its credentials, its graces), the uid a
root runner starts the job as (`JobIdentity`, SF_RUN_AS_*), and the job's own environment
(`child_env`), an allow-list that never holds what only the runner may see (`RUNNER_ONLY`),
with MLflow's tracking variables (`sf.tracking`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from typing import Any

from sf.contract import (
    API_URL_VAR,
    ARRAY_VARS,
    ATTEMPT_VAR,
    BOOTSTRAP_TOKEN_VAR,
    CHECKPOINT_DIR_VAR,
    DEFAULT_PREEMPT_GRACE_S,
    DEFAULT_STOP_GRACE_S,
    ENTRYPOINT_VAR,
    EXIT_FILE,
    EXIT_FILE_VAR,
    JOB_TOKEN_VAR,
    JOB_VARS,
    METRICS_FILE,
    METRICS_FILE_VAR,
    NICENESS_VAR,
    NODE_RANK_VAR,
    NOTICE_FILE,
    NOTICE_FILE_VAR,
    OUTPUT_DIR_VAR,
    PARENT_OUTPUT_DIR_VAR,
    PARENT_PREFIX,
    PREEMPT_GRACE_VAR,
    PROC_FILE_VAR,
    RANK_GPUS_VAR,
    RANK_LAUNCH_VAR,
    RANK_VARS,
    RECORD_KEY_VAR,
    RUN_AS_GID_VAR,
    RUN_AS_UID_VAR,
    RUN_AS_USER_VAR,
    RUN_AS_VARS,
    RUN_DIR,
    RUN_DIR_VAR,
    RUNNER_SECRETS,
    SANDBOX_VAR,
    SDK_DIR,
    SNAPSHOT_VAR,
    STARTED_FILE,
    STARTED_FILE_VAR,
    STOP_GRACE_VAR,
    USER_ENV_VAR,
)
from sf.http import Client
from sf.ingest import IngestError
from sf.tracking import tracking_env

# Names only the runner may see: its credentials, its own files, how it runs the job.
RUNNER_ONLY = RUNNER_SECRETS | frozenset(
    {
        BOOTSTRAP_TOKEN_VAR,
        EXIT_FILE_VAR,
        STARTED_FILE_VAR,
        PROC_FILE_VAR,
        API_URL_VAR,
        USER_ENV_VAR,
        *RUN_AS_VARS,
        RANK_LAUNCH_VAR,
        RANK_GPUS_VAR,
        STOP_GRACE_VAR,
        NICENESS_VAR,
        SANDBOX_VAR,
    }
)


# What a job sees of the contract when its own variables come apart (SF_USER_ENV).
CHILD_CONTRACT = (*JOB_VARS, PREEMPT_GRACE_VAR, *ARRAY_VARS)


BASE_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME")


class JobIdentity:
    """The uid the job runs as when the runner is root (SF_RUN_AS_UID/GID/USER)."""

    def __init__(self, uid: int, gid: int, user: str) -> None:
        self.uid, self.gid, self.user = uid, gid, user

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> JobIdentity | None:
        uid, gid = environ.get(RUN_AS_UID_VAR, ""), environ.get(RUN_AS_GID_VAR, "")
        if not uid:
            return None
        if not (uid.isdigit() and gid.isdigit()) or int(uid) == 0:
            raise IngestError(f"{RUN_AS_UID_VAR}/GID must be a non-root uid and a gid: {uid}/{gid}")
        if os.geteuid() != 0:
            raise IngestError(f"{RUN_AS_UID_VAR} is set but the runner is not root")
        return cls(int(uid), int(gid), environ.get(RUN_AS_USER_VAR) or f"uid{uid}")

    def popen_args(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": 0o077}

    def own_dir(self, path: str) -> None:
        """Create `path` (its parent must exist) as the job's, mode 0700, never following a
        link the job may have left there on an earlier attempt."""
        os.makedirs(path, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, self.uid, self.gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)

    def own_tree(self, root: str) -> None:
        """Give the unpacked snapshot to the job; `root` last, so it cannot enter before."""
        for folder, dirs, files in os.walk(root, topdown=False):
            for name in dirs + files:
                os.lchown(os.path.join(folder, name), self.uid, self.gid)
        self.own_dir(root)


class RunnerEnv:
    """The SF_* environment contract between executors and the runner."""

    def __init__(self, environ: dict[str, str]) -> None:
        self.environ = environ
        self.api_url = environ.get(API_URL_VAR, "")
        self.token = environ.get(JOB_TOKEN_VAR, "")
        self.bootstrap = environ.get(BOOTSTRAP_TOKEN_VAR, "")
        self.record_key = environ.get(RECORD_KEY_VAR, "")
        attempt = environ.get(ATTEMPT_VAR, "")
        self.attempt = int(attempt) if attempt.isdigit() else 1
        self.run_dir = os.path.abspath(environ.get(RUN_DIR_VAR) or RUN_DIR)
        self.output_dir = environ.get(OUTPUT_DIR_VAR, "")
        self.checkpoint_dir = environ.get(CHECKPOINT_DIR_VAR, "")
        self.entrypoint_raw = environ.get(ENTRYPOINT_VAR, "")
        self.snapshot = environ.get(SNAPSHOT_VAR, "")
        self.exit_file = os.path.abspath(environ.get(EXIT_FILE_VAR) or EXIT_FILE)
        self.started_file = os.path.abspath(environ.get(STARTED_FILE_VAR) or STARTED_FILE)
        self.attempt_dir = os.path.dirname(self.exit_file)
        # A job of another uid cannot write the attempt dir: its metrics go to a folder of its
        # own (SF_METRICS_FILE tells the SDK where, either way).
        metrics_dir = self.attempt_dir
        if environ.get(RUN_AS_UID_VAR):
            metrics_dir = os.path.join(self.attempt_dir, "metrics")
        self.metrics_file = os.path.join(metrics_dir, METRICS_FILE)
        self.notice_file = os.path.join(metrics_dir, NOTICE_FILE)
        self.sdk_dir = os.path.join(self.attempt_dir, SDK_DIR)
        self.stop_grace = _seconds(environ.get(STOP_GRACE_VAR), DEFAULT_STOP_GRACE_S)
        self.preempt_grace = _seconds(environ.get(PREEMPT_GRACE_VAR), DEFAULT_PREEMPT_GRACE_S)
        self.identity: JobIdentity | None = None

    def client(self) -> Client | None:
        return Client(self.api_url, self.token) if self.api_url else None

    @property
    def own_rank(self) -> int | None:
        """This runner's rank where each rank of a multi-node job has a runner of its own
        (a Kubernetes pod: the engine put SF_NODE_RANK in the runner's environment); None
        where one runner starts every rank, or the job has one."""
        raw = self.environ.get(NODE_RANK_VAR, "")
        return int(raw) if raw.isdigit() else None

    def shipping_client(self) -> Client | None:
        """Where logs, metrics and the start report go. Only rank 0's runner sends them when
        each rank has its own: one attempt has one line numbering, and the engine tells when
        the last rank is up. The other ranks' output stays in their own console.log."""
        rank = self.own_rank
        return self.client() if rank is None or rank == 0 else None

    def entrypoint(self) -> list[str]:
        try:
            argv = json.loads(self.entrypoint_raw)
        except ValueError as exc:
            raise IngestError(f"{ENTRYPOINT_VAR} is not valid JSON: {exc}") from exc
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise IngestError(f"{ENTRYPOINT_VAR} must be a non-empty JSON list of strings")
        return argv

    def job_dirs(self) -> list[str]:
        """The folders the job writes: TMPDIR only where the executor put it in the attempt."""
        tmpdir = self.environ.get("TMPDIR", "")
        dirs = [os.path.dirname(self.metrics_file), self.output_dir, self.checkpoint_dir]
        if tmpdir and os.path.dirname(os.path.abspath(tmpdir)) == self.attempt_dir:
            dirs.append(tmpdir)
        return [d for d in dirs if d]

    def sandbox_dirs(self) -> list[str]:
        """What the job reaches in its sandbox whatever the masks hide: its run dir, the
        folders it writes, and a follow-on's parent outputs (its team's too)."""
        parent = self.environ.get(PARENT_OUTPUT_DIR_VAR, "")
        extra = [parent] if parent and os.path.isdir(parent) else []
        return [self.run_dir, *self.job_dirs(), *extra]


def child_env(env: RunnerEnv) -> dict[str, str]:
    """The job's environment: never the runner's credentials, files or identity settings.

    With SF_USER_ENV (the local executor) it is the minimal base, the job's own variables and
    the contract a job may see; otherwise (the runner's environment holds the job's variables)
    the runner's environment without what only the runner may see."""
    environ = env.environ
    raw = environ.get(USER_ENV_VAR)
    if raw is None:
        out = {k: v for k, v in environ.items() if k not in RUNNER_ONLY}
    else:
        out = {k: environ[k] for k in BASE_NAMES if k in environ}
        out.update(_user_env(raw))
        out.update(
            {k: v for k, v in environ.items() if k in CHILD_CONTRACT or k.startswith(PARENT_PREFIX)}
        )
        if "CUDA_VISIBLE_DEVICES" in environ:
            out["CUDA_VISIBLE_DEVICES"] = environ["CUDA_VISIBLE_DEVICES"]
        # A rank with a runner of its own (a Kubernetes pod) got its contract from the engine.
        out.update({k: v for k, v in environ.items() if k in RANK_VARS})
    # The job's own code and PYTHONPATH first, the SDK last: a job with an `sf` of its own on
    # either keeps it; one without (its own venv, conda env or image) imports the runner's copy.
    path = (env.run_dir, out.get("PYTHONPATH"), env.sdk_dir)
    out["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    out["PYTHONUNBUFFERED"] = "1"
    out[METRICS_FILE_VAR] = env.metrics_file
    out[NOTICE_FILE_VAR] = env.notice_file
    out[PREEMPT_GRACE_VAR] = str(int(env.preempt_grace))
    # MLflow's client logs into the attempt (`sf.tracking`; a sandboxed job's URI is the
    # runner's forwarder, set once the sandbox is open), unless the job names its own server.
    out.update(tracking_env(env.api_url, env.token, out))
    return out


def install_sdk(target: str) -> None:
    """Copy the `sf` package (its modules only) to `target`/sf, readable by every uid and
    writable by none but the runner: `import sf; sf.log(...)` in whatever Python the job uses.
    Whatever the path held before (a runner started again, a job's link) is replaced."""
    package = os.path.dirname(os.path.abspath(__file__))
    if os.path.lexists(target) and not stat.S_ISDIR(os.lstat(target).st_mode):
        os.unlink(target)
    shutil.rmtree(target, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(package, os.path.join(target, "sf"), symlinks=False, ignore=ignore)
    for folder, _dirs, files in os.walk(target):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


def _seconds(raw: str | None, default: float) -> float:
    """A grace in whole seconds from the executor's environment, else `default`."""
    return float(raw) if raw and raw.isdigit() else default


def _user_env(raw: str) -> dict[str, str]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise IngestError(f"{USER_ENV_VAR} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise IngestError(f"{USER_ENV_VAR} must be a JSON object of strings")
    return {k: v for k, v in value.items() if k not in RUNNER_ONLY}
