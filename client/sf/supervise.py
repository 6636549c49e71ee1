"""Owns the job's processes on the runner's side: the runner as their subreaper, out of their
reach, and ending every one of them.

A job may fork, `setsid` and double-fork; as a child subreaper (Linux) the runner keeps all of
that below it, and `Supervisor` ends the whole tree on a stop and once the entrypoint exits, so
an exit record the runner writes means no process of the job remains. Made non-dumpable, the
runner's environment (its credentials) and memory are closed to a job of the same uid.
Standard library only, like the rest of the client.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from sf.system import proc_stats

KILL_GRACE_S = 10.0
REAP_POLL_S = 0.05
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def guard_runner() -> None:
    """First thing the runner does: a job of its uid may not read its environ or ptrace it,
    and whatever the job forks stays below it, however it detaches."""
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _prctl(option: int, value: int) -> bool:
    """Best effort: Linux only, and harmless where the call is refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _proc_table() -> dict[int, tuple[int, str]]:
    """Every process as pid -> (parent pid, state), from /proc."""
    table = {}
    for pid, fields in proc_stats():
        try:
            table[pid] = (int(fields[1]), fields[0].decode())
        except (IndexError, ValueError):
            continue
    return table


def descendants(pid: int) -> list[int]:
    """Live (non-zombie) processes below `pid`: as a child subreaper the runner keeps below
    it whatever its job forked, through setsid and double forks too."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _state) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return [p for p in found if table.get(p, (0, "Z"))[1] != "Z"]


def _reap_orphans() -> None:
    """Collect the exit status of processes reparented to us (only once the entrypoint has
    been waited for: this must not take its status from subprocess)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Supervisor:
    """Ends the whole job: on SIGTERM/SIGINT, on a preemption notice (SIGUSR1, which only an
    executor that can signal the runner alone sends) and when its entrypoint exits, every
    process below the runner gets SIGTERM, then SIGKILL after the grace; the runner waits
    until none is left, so an exit file it writes means no process of the job remains.

    A stop's grace is `stop_grace` (KILL_GRACE_S, or the preemption's where a SIGTERM may be
    one: Slurm, Kubernetes), a preemption's `preempt_grace`. Before the SIGTERM, `notice`
    (if given) is told what is coming and when SIGKILL follows: the job's notice file."""

    def __init__(
        self,
        procs: list[subprocess.Popen],
        terminate: Callable[[], None] | None = None,
        *,
        stop_grace: float = KILL_GRACE_S,
        preempt_grace: float = KILL_GRACE_S,
        notice: Callable[[str, float], None] | None = None,
        spared: Callable[[], set[int]] | None = None,
    ) -> None:
        self.procs = procs  # one process group per rank
        # The processes that hold the job's sandbox (`sf.sandbox.Sandbox.helpers`), not the
        # job's: a stop's SIGTERM is not theirs (the rank's `nsenter` must outlive its job to
        # report how it ended), only the SIGKILL after the grace is.
        self.spared = spared
        # How a SIGTERM reaches the ranks when not through their processes here (srun steps:
        # `sf.ranks.terminator`); the SIGKILL after the grace is sent here either way.
        self.terminate = terminate
        self.stop_grace, self.preempt_grace = stop_grace, preempt_grace
        self.notice = notice
        self.signalled = False  # a stop (SIGTERM/SIGINT) or a preemption reached the runner
        self.killer: threading.Timer | None = None
        self.kill_at: float | None = None  # monotonic time of the SIGKILL

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        signal.signal(signal.SIGUSR1, self._forward)

    def _forward(self, signum: int, _frame: Any) -> None:
        self.signalled = True
        preempted = signum == signal.SIGUSR1
        grace = self.preempt_grace if preempted else self.stop_grace
        if self.notice is not None:
            self.notice("preempted" if preempted else "stopped", time.time() + grace)
        self._signal_all(signal.SIGTERM if preempted else signum)
        self._arm(grace)

    def end_all(self) -> None:
        """SIGTERM every process of the job now, SIGKILL after KILL_GRACE_S (a stop, or one
        rank failed and the others must not go on without it)."""
        self._signal_all(signal.SIGTERM)
        self._arm(KILL_GRACE_S)

    def _arm(self, grace: float) -> None:
        """SIGKILL in `grace` seconds, unless one is due sooner already."""
        at = time.monotonic() + grace
        if self.killer is not None:
            if self.kill_at is not None and self.kill_at <= at:
                return
            self.killer.cancel()
        self.kill_at = at
        self.killer = threading.Timer(grace, self._signal_all, (signal.SIGKILL,))
        self.killer.daemon = True
        self.killer.start()

    def _signal_all(self, signum: int) -> None:
        if signum == signal.SIGTERM and self.terminate is not None:
            self.terminate()
            return
        spared: set[int] = set()
        if self.spared is not None:
            # A sandboxed rank's group leads with its nsenter: every process of the job is
            # below the runner, so the tree alone reaches them.
            spared = self.spared() if signum != signal.SIGKILL else set()
        else:
            for proc in self.procs:
                try:
                    os.killpg(proc.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass  # group already gone
        for pid in descendants(os.getpid()):
            if pid in spared:
                continue
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def end_leftovers(self, readers: list[threading.Thread]) -> None:
        """The entrypoint has exited: end what it left running, wait until nothing is, then
        let the readers drain the pipes."""
        if self._left():
            self._signal_all(signal.SIGTERM)
            self._arm(KILL_GRACE_S)
        while True:
            _reap_orphans()
            if not self._left():
                break
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                self._signal_all(signal.SIGKILL)
            time.sleep(REAP_POLL_S)
        if self.killer:
            self.killer.cancel()
        for reader in readers:
            reader.join(5.0)

    def _left(self) -> list[int]:
        """The job's processes still there (the sandbox's own are not the job's)."""
        spared = self.spared() if self.spared is not None else set()
        return [pid for pid in descendants(os.getpid()) if pid not in spared]
