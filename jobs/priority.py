"""The CPU priority of the control loops (SF_WORKER_NICE) and of the jobs they start.

A Celery worker or beat that shares its host with web workers lowers its own priority as it
starts (`starforge.celery`): a tick's burst (admitting and launching a few dozen jobs takes a
core 60 to 120 ms) then waits for the requests in flight instead of making every request queued
behind it wait. What the worker starts on its own host, the local executor's runners, must not
inherit that: each is told the priority the worker started with (`sf.contract.NICENESS_VAR`)
and takes it back before it starts the job, where its privileges allow.
"""

import os

_started_at: int | None = None


def yield_to_the_web(nice: int) -> None:
    """Lower this process's priority by `nice` (0 to 19) below the one it started with; the
    processes it forks from now on (a worker's pool) inherit it."""
    global _started_at
    if _started_at is None:
        _started_at = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, min(19, _started_at + nice))


def job_niceness() -> int | None:
    """The niceness a job started from this process runs at: the one the process started with,
    if it lowered its own (None: the job simply inherits this process's)."""
    return _started_at
