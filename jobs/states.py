"""The ledger's eight job states and the table of allowed transitions.

    QUEUED ──► SUBMITTED ──► PENDING ──► RUNNING ──► SUCCEEDED
      ▲  │         │  │         │           │
      │  │         │  └─► QUEUED (transient launch failure)
      │  └─► PAUSED/STOPPED ◄───┴───────────┤
      │                                     ▼
      └──────── retry/resume ◄── FAILED / STOPPED / PAUSED

The table below is the contract; the diagram is a reading aid.
"""

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
    # Non-zero exit, OOM, ingest failure, pending deadline, lost on backend.
    FAILED = "FAILED"
    # Stopped by a user or an admin.
    STOPPED = "STOPPED"
    # Process stopped by pause; resume goes back through QUEUED.
    PAUSED = "PAUSED"

    @classmethod
    def active(cls) -> frozenset["JobStatus"]:
        """States that hold a quota slot (and, from PENDING on, GPUs)."""
        return frozenset({cls.SUBMITTED, cls.PENDING, cls.RUNNING})

    @classmethod
    def terminal(cls) -> frozenset["JobStatus"]:
        """States in which nothing runs and the ledger waits for a person (or retry)."""
        return frozenset({cls.SUCCEEDED, cls.FAILED, cls.STOPPED, cls.PAUSED})

    @classmethod
    def holds_quota(cls) -> frozenset["JobStatus"]:
        return cls.active()

    @classmethod
    def holds_gpus(cls) -> frozenset["JobStatus"]:
        return frozenset({cls.PENDING, cls.RUNNING})

    @classmethod
    def metered(cls) -> frozenset["JobStatus"]:
        return frozenset({cls.RUNNING})


S = JobStatus
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
