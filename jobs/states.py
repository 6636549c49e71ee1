"""The ledger's eight job states, the table of allowed transitions, and which control verb a
person may use from which state (docs/ARCHITECTURE.md, "States").

    QUEUED ──► SUBMITTED ──► PENDING ──► RUNNING ──► SUCCEEDED
      ▲  │         │  │         │           │
      │  │         │  └─► QUEUED (transient launch failure)
      │  └─► PAUSED/STOPPED ◄───┴───────────┤
      │                                     ▼
      └──────── retry/resume ◄── FAILED / STOPPED / PAUSED

The tables below are the contract; the diagram is a reading aid.
"""

from dataclasses import dataclass

from django.db import models


class JobStatus(models.TextChoices):
    # Admitted, waiting for window / quota / capacity, or requeued after resume/retry.
    QUEUED = "QUEUED"
    # Quota reserved, executor launch in flight; job_ref being set.
    SUBMITTED = "SUBMITTED"
    # On the cluster, not training yet (allocation, image pull, snapshot unpack).
    PENDING = "PENDING"
    # Entrypoint executing; the attempt's start_time is set; GPU-seconds accrue.
    RUNNING = "RUNNING"
    # Exit 0. Final.
    SUCCEEDED = "SUCCEEDED"
    # Non-zero exit, OOM, ingest failure, pending deadline, lost on backend: the attempt keeps
    # which, a `sf.contract.Failure`, and it decides the automatic retry.
    FAILED = "FAILED"
    # Stopped by a user or an admin.
    STOPPED = "STOPPED"
    # Process stopped by pause; resume goes back through QUEUED.
    PAUSED = "PAUSED"

    @classmethod
    def active(cls) -> frozenset["JobStatus"]:
        """States that hold a quota slot (and, from PENDING on, GPUs): a launch is in flight or
        the job is on its cluster, so a stop or a pause must cancel it there."""
        return _ACTIVE

    @classmethod
    def terminal(cls) -> frozenset["JobStatus"]:
        """States in which nothing runs and the ledger waits for a person (or retry)."""
        return _TERMINAL

    @classmethod
    def holds_gpus(cls) -> frozenset["JobStatus"]:
        return _HOLDS_GPUS


S = JobStatus
# Built once: the API asks them of every job of a list, the loops of every job they touch.
_ACTIVE = frozenset({S.SUBMITTED, S.PENDING, S.RUNNING})
_TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.STOPPED, S.PAUSED})
_HOLDS_GPUS = frozenset({S.PENDING, S.RUNNING})
ALLOWED_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    S.QUEUED: frozenset({S.SUBMITTED, S.STOPPED, S.PAUSED}),
    S.SUBMITTED: frozenset({S.PENDING, S.FAILED, S.QUEUED, S.STOPPED, S.PAUSED}),
    S.PENDING: frozenset({S.RUNNING, S.FAILED, S.STOPPED, S.PAUSED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.STOPPED, S.PAUSED}),
    S.PAUSED: frozenset({S.QUEUED, S.STOPPED}),
    S.FAILED: frozenset({S.QUEUED, S.STOPPED}),
    S.STOPPED: frozenset({S.QUEUED}),
    S.SUCCEEDED: frozenset(),
}


def is_allowed(current: str, target: str) -> bool:
    return JobStatus(target) in ALLOWED_TRANSITIONS[JobStatus(current)]


def sources(target: JobStatus) -> frozenset[JobStatus]:
    """The states the table allows to move to `target`."""
    return frozenset(state for state, targets in ALLOWED_TRANSITIONS.items() if target in targets)


@dataclass(frozen=True)
class Verb:
    """A control verb: the state it moves a job to (None: `delete` removes the row) and the
    states it is allowed from. The API and the console's buttons read it, and the refusals
    the CLI prints are written from it."""

    name: str
    target: JobStatus | None
    allowed_from: frozenset[JobStatus]


VERBS: dict[str, Verb] = {
    # stop and pause: wherever the table allows their target (stop cancels a pending
    # automatic retry of a FAILED job, and ends a PAUSED one for good)
    "stop": Verb("stop", S.STOPPED, sources(S.STOPPED)),
    "pause": Verb("pause", S.PAUSED, sources(S.PAUSED)),
    # resume and retry both requeue; which one applies depends on where the job is
    "resume": Verb("resume", S.QUEUED, frozenset({S.PAUSED})),
    "retry": Verb("retry", S.QUEUED, frozenset({S.FAILED, S.STOPPED})),
    # delete: only what nothing runs for and nothing waits to admit
    "delete": Verb("delete", None, frozenset({S.SUCCEEDED, S.FAILED, S.STOPPED, S.PAUSED})),
}
