"""The executor interface: typed values in and out, idempotent by the deterministic name.

Every executor declares `STATE_TABLE`, an explicit map from each native state it can report to
the ledger state it means. A native state missing from the table never advances a job
(docs/ARCHITECTURE.md, invariant 2): the reconciler records it and leaves the job where it is.

Executors observe when asked to look and act only when the loops tell them to (see `Executor`).
What they share with the job-side runner (exit codes, file names, how records are signed, how
a file of the attempt dir is read) is `sf.contract`, not restated here.
"""

import datetime as dt
import fcntl
import hashlib
import hmac
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sf.contract import RUNNER_SECRETS, read_json, record_mac

from jobs.gpus import to_gpus_per_node
from jobs.states import JobStatus

if TYPE_CHECKING:
    from jobs.models import Cluster


# How much later than a job's time limit an engine that enforces limits itself (Slurm's
# --time, a Kubernetes Job's activeDeadlineSeconds) is told to end it: the reconciler stops the
# job at its limit to the tick, and the engine's limit is the backstop while no reconciler runs.
TIME_LIMIT_BACKSTOP_S = 60


@dataclass(frozen=True)
class LaunchSpec:
    name: str  # deterministic from run_id + attempt: the at-most-once key
    job_id: int
    run_id: str
    attempt: int
    total_gpus: int  # the sum over its ranks: nodes x gpus_per_node
    entrypoint: list[str]
    env: dict[str, str]  # user env plus the SF_* contract with the runner
    team: str = ""
    team_id: int = 0  # the local executor runs each team's jobs under its own uid (run_as "team")
    # What each of the `nodes` ranks needs (`gpus_per_node` of its GPUs).
    nodes: int = 1
    gpu_type: str = ""  # empty: any type
    cpus: int | None = None  # per node; None: the engine's default
    memory_mb: int | None = None  # per node; None: the engine's default
    image: str = ""  # Kubernetes: empty for the cluster's image
    # Seconds the attempt may run once up; None: no limit. The reconciler stops it at the
    # limit; an engine that can enforce a limit itself gets a backstop a little past it.
    time_limit_s: int | None = None
    pending_deadline_s: int = 0  # how long it may wait on the engine before it starts
    # The nodes the job's hung attempts ran on, oldest first (`Job.avoid_nodes`): an engine
    # that can keep an attempt off nodes (`AVOIDS_NODES`) keeps it off those `nodes_to_avoid`
    # names; the others never get any.
    avoid_nodes: tuple[str, ...] = ()

    @property
    def gpus_per_node(self) -> int:
        return to_gpus_per_node(self.total_gpus, self.nodes)


@dataclass(frozen=True)
class Observation:
    native_state: str  # a key of the executor's STATE_TABLE, or a state it does not know
    exit_code: int | None = None
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    # The backend's own words: why it waits (shown in Diagnostics while PENDING), or how it ended.
    message: str = ""
    # A failed end's cause (`sf.contract.Failure`); "" for every other end.
    failure: str = ""
    details: dict = field(default_factory=dict)
    # The object's deterministic name as the backend reports it, where the handle alone is not
    # unique: a restarted slurmctld that lost its state hands out job ids again.
    name: str = ""
    # The engine's own record of the run (Slurm's Start/End, a pod's container startedAt/
    # finishedAt, Ray's start_time/end_time), kept on the attempt beside the billed times:
    # the ledger never bills outside them (`jobs.ledger.clocks`). None where the engine has
    # not said (yet). `start_time`/`end_time` above are the times to bill from (the runner's
    # signed exit where the executor has one), which the engine's bound.
    engine_start: dt.datetime | None = None
    engine_end: dt.datetime | None = None
    # Whether the engine's start is when the attempt's run began, so the bill starts there
    # (Slurm's Start, a single pod's container start). False where the engine's start comes
    # earlier (Ray's start_time is the submission, before Ray's own queue; a gang's first
    # rank up while the others waited): it is kept and the bill never starts before it, but
    # the bill keeps the attempt's own start (invariant 5: queued time is never billed).
    engine_start_bills: bool = True


@dataclass(frozen=True)
class NodeCapacity:
    """One node as capacity counts it: the GPUs Starforge may use there (those jobs outside
    Starforge hold are not counted) and their type ("" where the engine names none)."""

    name: str
    gpus: int
    gpu_type: str = ""


@dataclass(frozen=True)
class Capacity:
    reachable: bool
    total_gpus: int = 0
    max_jobs: int | None = None  # None: the executor puts no cap on concurrent jobs
    virtual: bool = False  # GPU slots are counted, not real devices
    message: str = ""
    # Per node, where the engine says (the scheduler then places each rank of a job on a node
    # of its own that has room); empty: one pool of `total_gpus`, any type.
    nodes: tuple[NodeCapacity, ...] = ()
    # Whether several ranks of one job may share a node (local: ranks are process groups on
    # one host); Slurm's --nodes N means N distinct nodes.
    ranks_share_nodes: bool = False
    # GPU types of a pool cluster that names them but not its nodes (Ray's accelerator types):
    # a job may ask for one, and the engine places it; capacity is still the pool's sum.
    pool_gpu_types: tuple[str, ...] = ()

    @property
    def gpu_types(self) -> list[str]:
        """The GPU types the cluster has, sorted; empty when it names none."""
        return sorted({n.gpu_type for n in self.nodes if n.gpu_type} | set(self.pool_gpu_types))

    def largest_gang(self, gpus_per_node: int, gpu_type: str = "") -> int:
        """How many ranks of `gpus_per_node` GPUs the whole cluster could ever hold at once."""
        if not self.nodes:
            return self.total_gpus // gpus_per_node if gpus_per_node else 1 << 30
        fits = [n for n in self.nodes if gpu_type_matches(gpu_type, n.gpu_type)]
        if not gpus_per_node:
            return len(fits) if not self.ranks_share_nodes else 1 << 30
        if self.ranks_share_nodes:
            return sum(n.gpus // gpus_per_node for n in fits)
        return sum(1 for n in fits if n.gpus >= gpus_per_node)


def nodes_to_avoid(
    avoid: Sequence[str], capacity: Capacity, ranks: int, gpu_type: str
) -> list[str]:
    """Which of `avoid` (the nodes a job's hung attempts ran on, oldest first) its next attempt
    is kept off: only nodes the engine reports as taking jobs, the most recent first, each only
    while the nodes left of the job's GPU type still number its `ranks`, so that no job is kept
    off every node that could run it; the ones hung on longest ago are tried again first. None
    on a cluster that reports no nodes."""
    fits = {n.name for n in capacity.nodes if gpu_type_matches(gpu_type, n.gpu_type)}
    kept: list[str] = []
    for node in reversed(avoid):
        if node in fits and node not in kept and len(fits) - len(kept) > ranks:
            kept.append(node)
    return kept


def gpu_type_matches(wanted: str, have: str) -> bool:
    """Whether a node whose GPUs are `have` serves a job asking for `wanted` ("" for any).

    Case does not matter, and a short type matches a product name it is a word of: "a100"
    matches Slurm's "a100", NVML's "NVIDIA A100-SXM4-80GB" and Kubernetes' label value
    "NVIDIA-A100-SXM4-80GB"."""
    if not wanted:
        return True
    wanted, have = wanted.lower(), have.lower()
    return wanted == have or wanted in re.split(r"[\s_-]+", have)


class LaunchError(Exception):
    """A launch failed; `permanent` says whether trying again could help."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class Executor(Protocol):
    """One engine, as the loops and `check_ledger` see it.

    Observing and acting are apart. `poll`, `find`, `starforge_objects` and `capacity` only
    look: they cancel, kill, delete and write nothing, on the engine or in its files, so any
    caller may ask any number of times (a second worker's tick, `check_ledger`) and asking
    disturbs no job. The engine changes only when a loop says so: `submit` (the launcher),
    `cancel` (a stop, a pending deadline, the reconciler's sweep of closed attempts) and
    `reap_stale` (the reconciler, after each poll). Where a poll finds something that needs
    acting on, it marks that observation's `details` and stops there; the reconciler hands
    the poll's answer to `reap_stale` once it has acted on it, and `reap_stale` acts on what
    is marked and nothing else.
    """

    STATE_TABLE: ClassVar[dict[str, JobStatus]]

    @staticmethod
    def validate_settings(settings: dict) -> None:
        """Raise ValueError with a sentence when the cluster's settings cannot work."""

    def submit(self, spec: LaunchSpec) -> str: ...

    def find(self, name: str) -> str | None: ...

    def poll(self, job_refs: list[str]) -> dict[str, Observation]:
        """What the engine says of each of these objects, by ref; an object it does not know
        is left out. Looks only (see the class)."""
        ...

    def reap_stale(self, observations: dict[str, Observation]) -> list[str]:
        """Act on what `poll` marked in these observations (of open attempts, by ref) as left
        behind on the engine, and on nothing else; return the refs acted on. A failure to act
        is tried again at the next poll, which marks the object again."""
        ...

    def cancel(self, job_ref: str) -> None: ...

    # Whether a SIGTERM the engine sends the runner may be a preemption's notice (it cannot
    # signal the runner alone): the runner then gives a stop the preemption's grace too.
    PREEMPT_BY_TERM: ClassVar[bool]

    def preempt(self, job_ref: str, grace_s: int) -> None:
        """Give a job on borrowed GPUs its notice: SIGTERM to its processes (through the
        runner, which writes the job's notice file first), SIGKILL `grace_s` later. The
        reconciler cancels it once the grace is over, whatever this did (`deliver_notice`)."""
        ...

    def starforge_objects(self) -> dict[str, Observation]:
        """Every Starforge object the engine holds pending or running, by ref, with its name
        where the engine reports one: `check_ledger` looks for those no attempt accounts for."""
        ...

    def capacity(self) -> Capacity: ...


def deliver_notice(executor: Executor, job_ref: str, grace_s: int) -> None:
    """`executor.preempt`, or a plain cancel where an executor has no notice to give."""
    preempt = getattr(executor, "preempt", None)
    if preempt is None:
        executor.cancel(job_ref)
    else:
        preempt(job_ref, grace_s)


def epoch(value: object) -> dt.datetime | None:
    """Epoch seconds from a runner's file (`started.json`, `exit.json`) as an aware datetime;
    None for anything else. Job code can write next to those files, so a bad value must
    not raise in a poll and stop the reconciler for the whole cluster."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value:
        return None
    try:
        return dt.datetime.fromtimestamp(value, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None


# -- a job's environment -------------------------------------------------------------------------
# A job's environment is an allow-list (docs/ARCHITECTURE.md, invariant 8): its own env, the SF_*
# contract and this minimal base. Nothing of the server's or worker's environment is copied.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# An environment variable's name, as shells take it (match it whole): a job's own variables
# (submit) and a cluster's settings that name variables (the Ray nodes' `node_env`).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables that choose which accelerators a process sees: the platform sets them from what it
# allocated, so a job may not (a 0-GPU job with NVIDIA_VISIBLE_DEVICES=all would see them all).
GPU_VISIBILITY_VARS = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ZE_AFFINITY_MASK",
        "HABANA_VISIBLE_DEVICES",
        "NEURON_RT_VISIBLE_CORES",
        "TPU_VISIBLE_CHIPS",
        "ASCEND_RT_VISIBLE_DEVICES",
    }
)


def passed_on(env: dict[str, str], *, spec_is_public: bool) -> dict[str, str]:
    """The launch's variables an engine puts into its job: never GPU visibility (the engine
    sets it from what it allocated), and where others can read the job's spec, never the
    runner's secrets (`sf.contract.RUNNER_SECRETS`, from jobs.loops.launcher's
    runner_credentials), whatever the launch held: such engines get a one-time bootstrap
    credential instead."""
    dropped = GPU_VISIBILITY_VARS | RUNNER_SECRETS if spec_is_public else GPU_VISIBILITY_VARS
    return {k: v for k, v in env.items() if k not in dropped}


def base_env(home: str, tmpdir: str = "", path: str = DEFAULT_PATH) -> dict[str, str]:
    """The minimal base every job starts from: a PATH, a HOME, a UTF-8 locale, a TMPDIR."""
    env = {"PATH": path, "HOME": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    if tmpdir:
        env["TMPDIR"] = tmpdir
    return env


# -- the runner's records -----------------------------------------------------------------------
# The runner writes `started.json` and `exit.json` where job code can often write too (the same
# unix user on Slurm, or on the local executor without `run_as`). Each record carries an
# HMAC-SHA256 (`mac`) keyed by the attempt's record key, which only the runner holds (it is
# stripped from the job's environment and the runner is not dumpable): a record without a
# valid mac was written by the job, not the runner, and decides nothing.
RECORD_KEY_SALT = b"starforge.runner-record:"


def record_key(name: str) -> str:
    """The key the runner of backend object `name` signs its records with (SF_RECORD_KEY)."""
    from django.conf import settings

    secret = settings.SECRET_KEY.encode()
    return hmac.new(secret, RECORD_KEY_SALT + name.encode(), hashlib.sha256).hexdigest()


def read_record(path: Path, name: str) -> dict:
    """A runner record of backend object `name`, or {} when it is not one (`read_json`: missing,
    unreadable, a link, oversized, not a JSON object) or not signed by that runner (job code
    wrote it, or it names another attempt). The mac is the contract's `record_mac`."""
    record = read_json(path)
    if not isinstance(record.get("mac"), str):
        return {}
    if not hmac.compare_digest(record["mac"], record_mac(record_key(name), record)):
        return {}
    return record


def rank_details(record: dict) -> dict:
    """A multi-node attempt's ranks and the rank that failed first, from a signed record
    (the reconciler checks the rows before it keeps them)."""
    details = {}
    if isinstance(record.get("ranks"), list):
        details["ranks"] = record["ranks"]
    failed = record.get("failed_rank")
    if isinstance(failed, int) and not isinstance(failed, bool):
        details["failed_rank"] = failed
    return details


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing), for workers sharing a directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_known(settings: dict, known: set[str]) -> None:
    """Refuse keys the kind does not use: a typo must not silently fall back to a default."""
    unknown = sorted(set(settings) - known)
    if unknown:
        allowed = ", ".join(sorted(known | set(COMMON_SETTINGS)))
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}; this kind takes {allowed}")


def check_int(settings: dict, key: str, minimum: int = 0) -> None:
    value = settings.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key} must be a whole number of at least {minimum}, not {value!r}")


# Settings every kind understands, checked here and not passed to the executor's validation:
# where the kind's runners reach the API and write run outputs, when that differs from the server.
COMMON_SETTINGS = {
    "api_url": "URL the job-side runner uses to reach Starforge's API (default SF_API_URL)",
    "output_root": "directory of run outputs and checkpoints as the job sees it",
}
# Settings every kind understands that are numbers: how long a preempted job has between its
# notice (SIGTERM) and SIGKILL, and its bounds.
PREEMPT_GRACE = "preempt_grace_s"
PREEMPT_GRACE_MAX_S = 3600
KINDS = {
    "local": "jobs.executors.local.LocalExecutor",
    "slurm": "jobs.executors.slurm.SlurmExecutor",
    "ray": "jobs.executors.ray.RayExecutor",
    "kubernetes": "jobs.executors.kubernetes.KubernetesExecutor",
    "noop": "jobs.executors.noop.NoopExecutor",
}


def executor_class(kind: str) -> Any:
    """The executor class of a cluster kind, imported on first use (engines pull in clients)."""
    if kind not in KINDS:
        raise LaunchError(f"unknown cluster kind {kind!r}", permanent=True)
    module, _, name = KINDS[kind].rpartition(".")
    return getattr(import_module(module), name)


def check_request(cluster: "Cluster", *, nodes: int, image: str) -> None:
    """Raise ValueError with a sentence when the cluster's kind cannot run what a submit asks
    for: several nodes, or its own image. A kind says so by a static `check_request(settings,
    nodes=, image=)`; one without it runs any number of nodes and no images."""
    cls = executor_class(cluster.kind)
    own = getattr(cls, "check_request", None)
    if own is not None:
        own(cluster.settings, nodes=nodes, image=image)
    elif image:
        raise ValueError(
            f"cluster {cluster.name} is a {cluster.kind} cluster, which runs no container "
            "images; leave out --image"
        )


def validate_cluster_settings(kind: str, settings: object) -> dict:
    """Check a cluster's settings for its kind; return them, or raise ValueError saying why."""
    if kind not in KINDS:
        raise ValueError(f"unknown cluster kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not isinstance(settings, dict):
        raise ValueError("settings must be a JSON object")
    for key in COMMON_SETTINGS:
        value = settings.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{key} must be a non-empty string")
    api_url = settings.get("api_url")
    if api_url and not api_url.startswith(("http://", "https://")):
        raise ValueError(f"api_url must start with http:// or https://, not {api_url!r}")
    grace = settings.get(PREEMPT_GRACE)
    if grace is not None and (
        isinstance(grace, bool)
        or not isinstance(grace, int)
        or not 0 <= grace <= PREEMPT_GRACE_MAX_S
    ):
        raise ValueError(
            f"{PREEMPT_GRACE} must be a whole number of seconds from 0 to {PREEMPT_GRACE_MAX_S}, "
            f"not {grace!r}"
        )
    executor_class(kind).validate_settings(own_settings(settings))
    return settings


def own_settings(cluster_settings: dict) -> dict:
    """A cluster's settings less those every kind understands: what its executor checks."""
    return {
        k: v for k, v in cluster_settings.items() if k not in COMMON_SETTINGS and k != PREEMPT_GRACE
    }


def preempt_grace_s(cluster_settings: dict) -> int:
    """Seconds a preempted job of this cluster has from its notice (SIGTERM) to SIGKILL: the
    cluster's `preempt_grace_s` setting, else SF_PREEMPT_GRACE_S."""
    from django.conf import settings

    grace = cluster_settings.get(PREEMPT_GRACE)
    return grace if isinstance(grace, int) else settings.SF_PREEMPT_GRACE_S


# The one test seam: what `override` put in place of the real engines, by cluster id (None: all).
_overrides: dict[int | None, Callable[["Cluster"], Any]] = {}


@contextmanager
def override(cluster: "Cluster | None", make: Callable[["Cluster"], Any]) -> Iterator[None]:
    """Within the block, `executor_for(c)` answers `make(c)` for this cluster (None: for every
    cluster); `make` is an executor class or any callable standing in for `executor_for`.

    Tests put fakes here rather than patching each caller, so a new caller of `executor_for`
    cannot reach a real engine unnoticed.
    """
    key = None if cluster is None else cluster.pk
    previous = _overrides.get(key)
    _overrides[key] = make
    try:
        yield
    finally:
        if previous is not None:
            _overrides[key] = previous
        else:
            del _overrides[key]


def executor_for(cluster: "Cluster") -> Executor:
    if _overrides:
        make = _overrides.get(cluster.pk, _overrides.get(None))
        if make is not None:
            return make(cluster)
    try:
        cls = executor_class(cluster.kind)
    except LaunchError as exc:
        raise LaunchError(f"cluster {cluster.name}: {exc}", permanent=True) from exc
    return cls(cluster)
