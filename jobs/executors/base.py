"""The executor interface: typed values in and out, idempotent by the deterministic name.

Every executor declares `STATE_TABLE`, an explicit map from each native state it can report to
the ledger state it means. A native state missing from the table never advances a job
(ARCHITECTURE.md invariant 2): the reconciler records it and leaves the job where it is.
"""

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from jobs.states import JobStatus

if TYPE_CHECKING:
    from jobs.models import Cluster


@dataclass(frozen=True)
class LaunchSpec:
    name: str  # deterministic from run_id + attempt: the at-most-once key
    job_id: int
    run_id: str
    attempt: int
    gpus: int
    entrypoint: list[str]
    env: dict[str, str]  # user env plus the SF_* contract with the runner


@dataclass(frozen=True)
class Observation:
    native_state: str
    exit_code: int | None = None
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    message: str = ""
    # For failed ends: exit, oom, lost, preempted (retryable) or ingest, rejected (not).
    failure: str = ""
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Capacity:
    reachable: bool
    total_gpus: int = 0
    max_jobs: int | None = None  # None: the executor puts no cap on concurrent jobs
    virtual: bool = False  # GPU slots are counted, not real devices
    message: str = ""


class LaunchError(Exception):
    """A launch failed; `permanent` says whether trying again could help."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class Executor(Protocol):
    STATE_TABLE: ClassVar[dict[str, JobStatus]]

    def submit(self, spec: LaunchSpec) -> str: ...

    def find(self, name: str) -> str | None: ...

    def poll(self, job_refs: list[str]) -> dict[str, Observation]: ...

    def cancel(self, job_ref: str) -> None: ...

    def capacity(self) -> Capacity: ...


def executor_for(cluster: "Cluster") -> Executor:
    from jobs.executors.local import LocalExecutor
    from jobs.executors.noop import NoopExecutor

    kinds: dict[str, type] = {"local": LocalExecutor, "noop": NoopExecutor}
    if cluster.kind not in kinds:
        raise LaunchError(
            f"cluster {cluster.name} has unknown kind {cluster.kind!r}", permanent=True
        )
    return kinds[cluster.kind](cluster)
