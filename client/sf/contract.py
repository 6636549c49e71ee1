"""Owns the runner contract: the rules the job-side runner and its counterparts both follow.

The parties are the runner (`sf.runner`, inside the job's image or on the job's node), the
executors that start it and read what it leaves (`jobs.executors.*`: local, Slurm, Ray,
Kubernetes) and the scheduler, which names each attempt's backend object. Each rule has its one
value here; a party imports it instead of writing the value down again, so the two sides cannot
drift apart:

- the runner's exit codes that counterparts interpret (INGEST_EXIT, 128+N for a signal), and
  the words that open an ingest failure's reason;
- `Failure`, why an attempt failed: what an executor observes, what the ledger keeps, which
  causes an automatic retry follows, and what the API answers;
- the backend-name prefix and `backend_name`, the deterministic name of an attempt's object;
- every SF_* variable of the runner's and the job's environment: who sets it and who reads it
  (the launcher, an executor, the runner, the job's SDK), each named once below;
- the files the runner keeps in its attempt directory, and the variables through which an
  executor says where they go;
- `record_mac`, how the runner signs its records, and `read_json`, the one way a counterpart
  reads a file of an attempt directory, where job code may have written.

Standard library only and no Django: the runner imports it inside arbitrary job images (Python
3.10 and later, the client's floor), and the server imports it from the installed client.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import os
import stat
from typing import Any

# -- exit codes ------------------------------------------------------------------------------
# The runner exits INGEST_EXIT when the job could not be prepared (snapshot fetch or unpack,
# entrypoint, identity): the user's code never ran, so the attempt is billed nothing and the
# failure is not the user's exit.
INGEST_EXIT = 86
# When the entrypoint is killed by signal N the runner exits 128+N, as a shell does; the
# executors report that as exit code -N, the way the local executor sees it from the process.
SIGNAL_EXIT_BASE = 128
MAX_SIGNAL = 64  # Linux's highest signal number (SIGRTMAX)
# Every reason the runner writes for an ingest failure starts with these words; executors find
# the runner's sentence by them in exit records and log tails.
INGEST_FAILED = "ingest failed"


def exit_status(code: int) -> int:
    """The runner's own exit status for its entrypoint's return code (-N: killed by signal N)."""
    return SIGNAL_EXIT_BASE - code if code < 0 else code


def killed_by(status: int) -> int | None:
    """The signal that killed the entrypoint when the runner's exit status says so, else None."""
    if SIGNAL_EXIT_BASE < status <= SIGNAL_EXIT_BASE + MAX_SIGNAL:
        return status - SIGNAL_EXIT_BASE
    return None


def entrypoint_code(status: int) -> int:
    """The entrypoint's return code from the runner's exit status: -N for 128+N, else itself."""
    signal = killed_by(status)
    return status if signal is None else -signal


# -- failure causes --------------------------------------------------------------------------
class Failure(str, enum.Enum):
    """Why an attempt failed: the cause an executor observes (`Observation.failure`), the
    ledger keeps (`Attempt.failure`: these values are stored, so none is ever changed or
    removed) and the API answers; it decides whether an automatic retry follows
    (docs/ARCHITECTURE.md, "Executor interface")."""

    # The entrypoint exited non-zero or was killed by a signal: the user's code ended it.
    EXIT = "exit"
    # Killed for its memory (the kernel's or the engine's limit: OOMKilled, OUT_OF_MEMORY).
    OOM = "oom"
    # The engine lost it: its node failed, was evicted or drained, or the backend object
    # vanished past the grace; the code did nothing wrong.
    LOST = "lost"
    # The engine preempted or requeued it for other work (Slurm PREEMPTED, a preempted pod).
    # Starforge's own preemption of borrowed GPUs is no failure: it pauses the job.
    PREEMPTED = "preempted"
    # The runner could not prepare the job (INGEST_EXIT: the snapshot, the identity, the
    # entrypoint): the user's code never ran, and running it again would fail the same way.
    INGEST = "ingest"
    # It waited past a deadline to start (the job's pending deadline, Ray's start timeout) or
    # the engine ended it at a deadline of its own (a Kubernetes Job's activeDeadlineSeconds).
    DEADLINE = "deadline"
    # The engine refused the launch for good (the request can never be met as asked).
    REJECTED = "rejected"
    # Observed only, never kept: the engine's own time limit (Slurm's TIMEOUT). A run past the
    # job's time limit is a stop; any other is kept as EXIT, retryable (`recorded_as`).
    TIMEOUT = "timeout"
    # Its ranks made no progress for its team's hang_after and the policy's hang_action is
    # fail (jobs.loops.activity): a deadlock may not recur, so another try is worth it.
    HUNG = "hung"

    def __str__(self) -> str:  # the value, in f-strings and messages, on every Python
        return self.value

    @classmethod
    def retryable(cls) -> frozenset[Failure]:
        """Causes an automatic retry may follow: the run could go another way next time."""
        return _RETRYABLE

    @classmethod
    def time_limits(cls) -> frozenset[Failure]:
        """Ends an engine reports at a time limit of its own: a stop, when the job's own time
        limit had passed by then."""
        return _TIME_LIMITS

    @classmethod
    def recorded(cls) -> tuple[Failure, ...]:
        """The causes the ledger keeps, in this order: every one but TIMEOUT."""
        return _RECORDED

    @classmethod
    def recorded_as(cls, observed: str) -> Failure:
        """The cause the ledger keeps for a failed end the engine observed as `observed`
        ("": the engine named none, so the entrypoint's exit)."""
        cause = cls(observed) if observed else cls.EXIT
        return cls.EXIT if cause is cls.TIMEOUT else cause


_RETRYABLE = frozenset({Failure.EXIT, Failure.OOM, Failure.LOST, Failure.PREEMPTED, Failure.HUNG})
_TIME_LIMITS = frozenset({Failure.TIMEOUT, Failure.DEADLINE})
_RECORDED = tuple(cause for cause in Failure if cause is not Failure.TIMEOUT)


# -- backend names ---------------------------------------------------------------------------
# Every backend object Starforge makes is named with this prefix: engines find their own among
# other users' jobs by it (Slurm's job names), and it is the at-most-once key of a launch.
BACKEND_PREFIX = "sf-"


def backend_name(run_id: str, attempt: int) -> str:
    """The deterministic name of attempt `attempt` of run `run_id` on every engine."""
    return f"{BACKEND_PREFIX}{run_id}-a{attempt}"


# -- the job's environment -------------------------------------------------------------------
# Every name below is SF_*: a job may not set one of its own (submit refuses them), so none can
# be taken for the contract's. The launcher (`jobs.loops.launcher.launch_spec`) sets these on
# every engine; the runner reads them, and the job sees those of JOB_VARS.
RUN_ID_VAR = "SF_RUN_ID"  # the run's stable id: the same on every attempt
ATTEMPT_VAR = "SF_ATTEMPT"  # the attempt's number, from 1
JOB_ID_VAR = "SF_JOB_ID"  # the job's id in the ledger
OUTPUT_DIR_VAR = "SF_OUTPUT_DIR"  # the run's outputs, the same folder on every attempt
CHECKPOINT_DIR_VAR = "SF_CHECKPOINT_DIR"  # where the job saves checkpoints (below the outputs)
JOB_VARS = (RUN_ID_VAR, ATTEMPT_VAR, JOB_ID_VAR, OUTPUT_DIR_VAR, CHECKPOINT_DIR_VAR)
ENTRYPOINT_VAR = "SF_ENTRYPOINT"  # the job's command, a JSON list of strings
SNAPSHOT_VAR = "SF_SNAPSHOT"  # the working-directory snapshot's sha256 the runner fetches
API_URL_VAR = "SF_API_URL"  # where the runner reaches the server ("": offline, nothing shipped)
# The job's own variables apart, as a JSON object: a runner that is not the job's uid (the
# local executor's run_as) applies them to the job alone, never to itself. Without it the
# runner's environment holds them (the other engines).
USER_ENV_VAR = "SF_USER_ENV"
# A follow-on job reads its parent's outputs: the parent's run id and output folder, and
# whatever else the launcher names with this prefix.
PARENT_PREFIX = "SF_PARENT_"
PARENT_RUN_ID_VAR = "SF_PARENT_RUN_ID"
PARENT_OUTPUT_DIR_VAR = "SF_PARENT_OUTPUT_DIR"
# The local executor's run_as: the account a root runner starts the job as (uid, gid, name).
RUN_AS_UID_VAR = "SF_RUN_AS_UID"
RUN_AS_GID_VAR = "SF_RUN_AS_GID"
RUN_AS_USER_VAR = "SF_RUN_AS_USER"
RUN_AS_VARS = (RUN_AS_UID_VAR, RUN_AS_GID_VAR, RUN_AS_USER_VAR)
# The runner tells the job where the SDK (`sf.log`) appends its points, which the runner tails
# and ships (the file: METRICS_FILE, below); the notice file's variable is NOTICE_FILE_VAR.
METRICS_FILE_VAR = "SF_METRICS_FILE"
# Seconds between the runner's CPU, memory and GPU samples (`sf.system`; default 5): read from
# the job's environment as the runner has it (an engine's, or a test's).
SYSTEM_SAMPLE_VAR = "SF_SYSTEM_SAMPLE_S"

# -- the attempt directory -------------------------------------------------------------------
EXIT_FILE = "exit.json"  # signed outcome: exit_code (None: ingest failed), reason, started_at...
STARTED_FILE = "started.json"  # signed when the entrypoint is spawned: started_at, pid (its pgid)
PROC_FILE = "proc.json"  # the runner's own pid, unsigned: where a stop is sent
CONSOLE_LOG = "console.log"  # the job's stdout and stderr, line by line
METRICS_FILE = "metrics.jsonl"  # the SDK's points, in the attempt dir or metrics/ below it
RUN_DIR = "work"  # the run dir (the unpacked snapshot, the job's cwd) below the attempt dir
NOTICE_FILE = "notice.json"  # written by the runner when a stop or a preemption is on its way
# The SDK for the job's own Python (`sf.log` with no install): a copy of the `sf` package the
# runner makes here, last on every rank's PYTHONPATH (`sf.environment.install_sdk`).
SDK_DIR = "sdk"
# The local executor's liveness lock: the runner inherits it locked and holds it as long as it
# lives (it never passes the descriptor on to the job), so a held lock means a live runner.
LIVENESS_LOCK = "alive.lock"

# The variables through which an executor tells the runner where its files go; each defaults
# to the name above in the runner's working directory.
EXIT_FILE_VAR = "SF_EXIT_FILE"
STARTED_FILE_VAR = "SF_STARTED_FILE"
PROC_FILE_VAR = "SF_PROC_FILE"
RUN_DIR_VAR = "SF_RUN_DIR"
# The CPU niceness the runner takes back before it starts the job, where it may: the one the
# worker that started it had before it lowered its own (SF_WORKER_NICE, jobs.priority).
NICENESS_VAR = "SF_NICENESS"
# How a stop reaches the job (sf.supervise): SIGTERM to every process, SIGKILL a grace later.
# A preemption (taking borrowed GPUs back) is the runner's SIGUSR1 where the executor can
# signal the runner alone (local), else a SIGTERM like a stop (Slurm, Kubernetes), whose grace
# is then the preemption's. The job sees SF_PREEMPT_GRACE_S and finds the notice (when it was
# sent, when SIGKILL follows) in SF_NOTICE_FILE: `sf.should_checkpoint()` reads it.
PREEMPT_GRACE_VAR = "SF_PREEMPT_GRACE_S"
STOP_GRACE_VAR = "SF_STOP_GRACE_S"
NOTICE_FILE_VAR = "SF_NOTICE_FILE"
DEFAULT_STOP_GRACE_S = 10.0
# A task of a job array learns which one it is: the array's id, its index, and its parameter
# set (the array file's line) as JSON ("{}" for --array indices).
ARRAY_ID_VAR = "SF_ARRAY_ID"
ARRAY_INDEX_VAR = "SF_ARRAY_INDEX"
ARRAY_PARAMS_VAR = "SF_ARRAY_PARAMS"
ARRAY_VARS = (ARRAY_ID_VAR, ARRAY_INDEX_VAR, ARRAY_PARAMS_VAR)
DEFAULT_PREEMPT_GRACE_S = 120.0
# The runner's credentials: the attempt's job token and the key it signs its records with.
# Only the runner may see them (never the job), and no engine whose job specs others can read
# may carry them.
JOB_TOKEN_VAR = "SF_JOB_TOKEN"
RECORD_KEY_VAR = "SF_RECORD_KEY"
RUNNER_SECRETS = frozenset({JOB_TOKEN_VAR, RECORD_KEY_VAR})
# What those engines carry instead: a one-time credential the runner exchanges at start for its
# job token (POST /api/v1/ingest/token), spent once read.
BOOTSTRAP_TOKEN_VAR = "SF_BOOTSTRAP_TOKEN"

# -- MLflow tracking ---------------------------------------------------------------------------
# Starforge is an MLflow tracking server for its jobs: the runner puts these two in every job's
# environment, so the official `mlflow` client logs into the attempt unchanged. The URI is the
# server's MLflow root (`TRACKING_PATH` below the API's address, or the runner's forwarder inside
# a sandbox); MLflow's client sends the token as a bearer token.
TRACKING_URI_VAR = "MLFLOW_TRACKING_URI"
TRACKING_TOKEN_VAR = "MLFLOW_TRACKING_TOKEN"
TRACKING_PATH = "/mlflow"
TRACKING_TOKEN_PREFIX = "sft."
_TRACKING_PURPOSE = b"starforge.mlflow-tracking"


# TensorBoard: the runner reads the event files under the job's output and run directories and
# under the folder the job's environment names in either of these (`sf.tensorboard`).
TENSORBOARD_LOGDIR_VAR = "TENSORBOARD_LOGDIR"
TENSORBOARD_DIR_VAR = "SF_TENSORBOARD_DIR"


def tracking_token(job_token: str) -> str:
    """The MLflow credential of the attempt a job token names, for the job's own code, which must
    never hold the job token: `sft.<job>.<attempt>.<mac>`, the mac an HMAC of the purpose keyed
    by the job token. The runner derives it; the server recomputes it from the attempt's current
    job token, so it names that attempt alone, can do only what the server lets a tracking token
    do (add to its own attempt), and dies with the attempt's job token. It reveals nothing of
    the job token (HMAC is one way)."""
    job, attempt = job_token.split(":", 1)[0].split(".")[:2]
    mac = hmac.new(job_token.encode(), _TRACKING_PURPOSE, hashlib.sha256).hexdigest()
    return f"{TRACKING_TOKEN_PREFIX}{job}.{attempt}.{mac}"


def file_env(attempt_dir: str | os.PathLike[str], *, proc_file: bool = False) -> dict[str, str]:
    """The variables that put the runner's records and run dir in `attempt_dir`; with
    `proc_file`, its pid record too (an executor that signals the runner itself)."""
    root = os.fspath(attempt_dir)
    env = {
        EXIT_FILE_VAR: os.path.join(root, EXIT_FILE),
        STARTED_FILE_VAR: os.path.join(root, STARTED_FILE),
        RUN_DIR_VAR: os.path.join(root, RUN_DIR),
    }
    if proc_file:
        env[PROC_FILE_VAR] = os.path.join(root, PROC_FILE)
    return env


# -- records ---------------------------------------------------------------------------------
# A record larger than this is no record: the runner's are a few hundred bytes, and a reader
# must not take into memory whatever a job left in the attempt dir.
MAX_RECORD_BYTES = 1 << 20


def record_mac(key: str, record: dict) -> str:
    """HMAC-SHA256 of a record without its `mac`, over the canonical JSON: the runner signs
    with it, and the server checks with it (`jobs.executors.base.read_record`)."""
    body = {k: v for k, v in record.items() if k != "mac"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key.encode(), canonical, hashlib.sha256).hexdigest()


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in the file at `path`, or {} for anything else.

    Job code can write where these files lie (its run dir is inside the attempt dir, and on
    several engines it runs as the runner's uid), so nothing it leaves there may raise, block
    or mislead the reader: a missing or unreadable file, a symlink (to a file the job could not
    read itself), anything but a regular file (a FIFO would block the open), more than
    MAX_RECORD_BYTES, invalid JSON (NaN and Infinity included, nesting too deep to parse) and
    JSON that is not an object all read as {}.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_RECORD_BYTES:
            chunk = os.read(fd, MAX_RECORD_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return {}
    finally:
        os.close(fd)
    if size > MAX_RECORD_BYTES:
        return {}
    try:
        value = json.loads(b"".join(chunks), parse_constant=_not_json)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return {}
    return value if isinstance(value, dict) else {}


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# -- ranks of a multi-node job ---------------------------------------------------------------
# Every rank of a job gets these (README, "Multi-node jobs"): the SF_* names, and the names
# torchrun and common launchers read, so `torchrun train.py` needs no arguments.
NODE_RANK_VAR = "SF_NODE_RANK"
NUM_NODES_VAR = "SF_NUM_NODES"
GPUS_PER_NODE_VAR = "SF_GPUS_PER_NODE"
MASTER_ADDR_VAR = "SF_MASTER_ADDR"
MASTER_PORT_VAR = "SF_MASTER_PORT"
NODE_ADDRS_VAR = "SF_NODE_ADDRS"
LAUNCHER_RANK_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "WORLD_SIZE",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
RANK_VARS = frozenset(
    {
        NODE_RANK_VAR,
        NUM_NODES_VAR,
        GPUS_PER_NODE_VAR,
        MASTER_ADDR_VAR,
        MASTER_PORT_VAR,
        NODE_ADDRS_VAR,
        *LAUNCHER_RANK_VARS,
    }
)
# How the runner starts the ranks of one attempt (SF_RANK_LAUNCH): "local", process groups on
# its own host, each with the GPUs of SF_RANK_GPUS (a JSON list, one CUDA_VISIBLE_DEVICES value
# per rank); "srun", one `srun` step per rank inside the Slurm allocation the runner is in.
# Unset: one rank, the job itself (every single-node job).
RANK_LAUNCH_VAR = "SF_RANK_LAUNCH"
RANK_GPUS_VAR = "SF_RANK_GPUS"
RANK_LAUNCHES = ("local", "srun")
# The local executor's sandbox (`sf.sandbox`): JSON {"net_gid": N, "devices": [paths]}, the
# group its network helper runs under and the device nodes the job gets. Unset: no sandbox
# (the runner starts the ranks on the host as it always did: other engines, or run_as none).
SANDBOX_VAR = "SF_SANDBOX"
# The states a rank reports (started.json and exit.json carry `ranks`: one object per rank
# with rank, node, state, exit_code).
RANK_STATES = ("running", "succeeded", "failed", "killed")


def rank_env(rank: int, nodes: int, gpus_per_node: int, addrs: list[str], port: int) -> dict:
    """The variables rank `rank` of a job on `nodes` nodes gets; `addrs` are the nodes'
    addresses in rank order (rank 0's first: every rank reaches it at `port`)."""
    master = addrs[0]
    values = {
        NODE_RANK_VAR: rank,
        NUM_NODES_VAR: nodes,
        GPUS_PER_NODE_VAR: gpus_per_node,
        MASTER_ADDR_VAR: master,
        MASTER_PORT_VAR: port,
        NODE_ADDRS_VAR: ",".join(addrs),
        "MASTER_ADDR": master,
        "MASTER_PORT": port,
        "NODE_RANK": rank,
        "WORLD_SIZE": nodes,
        "PET_NNODES": nodes,
        "PET_NODE_RANK": rank,
        # torchrun starts one process per GPU; a CPU-only rank runs one process.
        "PET_NPROC_PER_NODE": max(gpus_per_node, 1),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": port,
    }
    return {k: str(v) for k, v in values.items()}
