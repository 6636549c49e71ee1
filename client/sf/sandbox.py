"""Owns the sandbox the local executor's runner puts a job in: one per attempt, every rank in it.

The runner stays outside, as root on the host's network, because it talks to the API and
supervises the job. Inside are the job's processes, in namespaces of their own:

- **network**: only the sandbox's own loopback and an interface that `pasta` (Debian's
  `passt`) gives outbound connectivity through the host's sockets. Nothing is forwarded in,
  the gateway address is not mapped to the host's loopback (`--no-map-gw`), and pasta runs
  under the group `SandboxConfig.net_gid`, whose connections to this host's own addresses
  (and to the networks the operator did not allow) the host's firewall refuses
  (`jobs.executors.sandbox`). The ranks of a multi-node job share the namespace, so their
  rendezvous on 127.0.0.1 works and no other job reaches it;
- **PID**: the job sees only its own processes in /proc, and the sandbox's: its init, its
  anchor and pasta;
- **IPC** and **mounts**: the host's tree as it is, but a fresh /proc and a minimal /dev
  (with the GPU device nodes the executor names), and private /tmp, /var/tmp, /dev/shm and
  /run, so no unix socket of the host's services (PostgreSQL's, a Ray session's) and no other
  job's temporary file is in reach. The job's own folders are bound back over those masks.

Made of maintained tools, never namespace code of our own: `bwrap` (bubblewrap) makes the
namespaces around an anchor process (`sleep infinity`), `pasta` joins its network namespace,
and each rank enters with `nsenter` under the job's uid. `nsenter` stays outside as the rank's
process the runner waits for; it passes on the rank's exit status and the signal that ended
it. So that a stop's SIGTERM reaches only the job, the runner never sends it to these helpers
(`Sandbox.helpers`); a SIGKILL, and the sandbox's close, end everything. When the runner dies,
bwrap (`--die-with-parent`) takes the sandbox's init with it, and with the init every process
of its PID namespace, pasta's included.

Standard library only, like the rest of the runner.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from sf.contract import SANDBOX_VAR

# Where the host keeps what a job must not reach through the file system: other jobs'
# temporary files and the unix sockets of services (PostgreSQL's, Redis's, a Ray session's).
MASKED = ("/tmp", "/var/tmp", "/run")
READY_TIMEOUT_S = 10.0
TOOLS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
POLL_S = 0.01


# Run by `Sandbox.listen_inside` in the sandbox's network namespace (as root, on the host's
# files): a listening socket on the sandbox's loopback, handed back over the socket pair whose
# end is argv[1]. A socket stays in the namespace it was made in, wherever its descriptor goes.
LISTEN_INSIDE = """
import socket, sys
back = socket.socket(fileno=int(sys.argv[1]))
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.bind(("127.0.0.1", 0))
server.listen(128)
socket.send_fds(back, [b"listening"], [server.fileno()])
"""


class SandboxError(Exception):
    """The sandbox could not be made: the job never runs (an ingest failure)."""


@dataclass(frozen=True)
class SandboxConfig:
    """What the executor asked for (SF_SANDBOX, JSON): the group the network helper runs
    under, the device nodes the job gets (each at /dev/<its name>), and the operator's
    software folders the job reads although they may live under a mask."""

    net_gid: int
    devices: tuple[str, ...] = ()
    software: tuple[str, ...] = ()

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> SandboxConfig | None:
        raw = environ.get(SANDBOX_VAR, "")
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise SandboxError(f"{SANDBOX_VAR} is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise SandboxError(f"{SANDBOX_VAR} must be a JSON object")
        gid = value.get("net_gid")
        if not isinstance(gid, int) or isinstance(gid, bool) or gid <= 0:
            raise SandboxError(f"{SANDBOX_VAR} needs net_gid, a positive group id")
        devices, software = (_paths(value, name) for name in ("devices", "software"))
        return cls(gid, devices, software)


def _paths(value: dict, name: str) -> tuple[str, ...]:
    paths = value.get(name, [])
    if not isinstance(paths, list) or not all(
        isinstance(p, str) and p.startswith("/") for p in paths
    ):
        raise SandboxError(f"{SANDBOX_VAR}'s {name} must be a list of absolute paths")
    return tuple(paths)


def holder_argv(config: SandboxConfig, writable: list[str], readable: list[str]) -> list[str]:
    """bwrap around the anchor: new PID, network, IPC and mount namespaces. The anchor runs as
    root without any capability and in the network helper's group, which is what lets pasta
    (the same uid and group, fewer rights) open its network namespace and nothing else."""
    argv = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    argv += ["--bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--tmpfs", "/dev/shm"]
    for device in config.devices:
        argv += ["--dev-bind", device, f"/dev/{os.path.basename(device)}"]
    for masked in MASKED:
        argv += ["--perms", "0755" if masked == "/run" else "1777", "--tmpfs", masked]
    # Back over the masks (a checkout or a test's folders may live under /tmp): what the job
    # runs with, read-only, and its own folders.
    readable = [p for p in readable if _under_masked(p)]
    writable = [os.path.realpath(p) for p in writable]
    for folder in _folders_on_the_way([*readable, *writable]):
        argv += ["--perms", "0711", "--dir", folder]  # bwrap would make them 0700
    for path in readable:
        argv += ["--ro-bind", path, path]
    for path in writable:
        argv += ["--bind", path, path]
    anchor = ["setpriv", f"--regid={config.net_gid}", "--clear-groups"]
    anchor += ["--inh-caps=-all", "--bounding-set=-all", "--", "sleep", "infinity"]
    return [*argv, "--", *anchor]


def net_argv(config: SandboxConfig, anchor: int, pid_file: str) -> list[str]:
    """pasta in the anchor's network namespace: outbound only, no port forwarded either way,
    the gateway not mapped to the host's loopback. It runs in the sandbox's PID namespace (on
    the host's network and files), so it ends with the sandbox, the runner's death included:
    a parent-death signal would not hold, as pasta's change of group clears it."""
    pasta = ["pasta", "--foreground", "--quiet", "--config-net", "--no-map-gw"]
    pasta += ["-t", "none", "-u", "none", "-T", "none", "-U", "none"]
    pasta += ["--runas", f"0:{config.net_gid}", "--pid", pid_file]
    pasta += ["--netns", f"/proc/{anchor}/ns/net"]
    return ["nsenter", f"--target={anchor}", "--pid", "--", *pasta]


def job_readable() -> list[str]:
    """What the job runs with that may live under a masked folder: the interpreter (`python`
    in a job means the runner's), its environment, and this client (the `sf` SDK)."""
    client = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(os.path.realpath(p) for p in (*paths, client))


def _folders_on_the_way(paths: list[str]) -> list[str]:
    """The folders inside a mask that lead to `paths`, parents first: traversable, not
    listable, as the executor leaves them on the host."""
    found: list[str] = []
    for path in paths:
        parent = os.path.dirname(os.path.realpath(path))
        chain = []
        while parent not in MASKED and _under_masked(parent):
            chain.append(parent)
            parent = os.path.dirname(parent)
        found += [f for f in reversed(chain) if f not in found]
    return found


def _under_masked(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == m or real.startswith(m + "/") for m in MASKED)


class Sandbox:
    """One attempt's namespaces, while the runner holds them open."""

    def __init__(self, holder: subprocess.Popen, anchor: int, scratch: str) -> None:
        self.holder, self.anchor, self.scratch = holder, anchor, scratch
        self.net: subprocess.Popen | None = None
        self.entered: set[int] = set()  # each rank's nsenter

    @classmethod
    def open(
        cls,
        config: SandboxConfig,
        writable: list[str],
        scratch: str,
        readable: list[str] | None = None,
    ) -> Sandbox:
        """Start the anchor and its network helper; return once a rank can enter. `readable`:
        what the job reads besides `job_readable()` (the runner's copy of the SDK)."""
        env = {"PATH": TOOLS_PATH}
        try:
            holder = subprocess.Popen(
                holder_argv(
                    config, writable, [*job_readable(), *config.software, *(readable or [])]
                ),
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # out of the runner's group: a stop signals the job
            )
        except OSError as exc:
            raise SandboxError(f"cannot start bwrap: {exc}") from exc
        sandbox = cls(holder, 0, scratch)
        try:
            sandbox.anchor = _wait_for_anchor(holder)
            pid_file = os.path.join(scratch, "sandbox-net.pid")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pid_file)
            sandbox.net = subprocess.Popen(
                net_argv(config, sandbox.anchor, pid_file),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            _wait_for_file(pid_file, sandbox.net, "pasta (the sandbox's network)")
        except (OSError, SandboxError) as exc:
            sandbox.close()
            raise SandboxError(str(exc)) from exc
        return sandbox

    def enter(self, argv: list[str], cwd: str, uid: int | None, gid: int | None) -> list[str]:
        """The command line that runs `argv` inside, in `cwd`, as uid/gid (no other group)."""
        wrapper = ["nsenter", f"--target={self.anchor}", "--mount", "--net", "--pid", "--ipc"]
        wrapper.append(f"--wdns={cwd}")  # opened inside: --wd would keep the host's mount
        if uid is not None and gid is not None:
            wrapper += [f"--setuid={uid}", f"--setgid={gid}"]
        return [*wrapper, "--", *argv]

    def adopt(self, pid: int) -> None:
        """Remember a rank's nsenter: it must outlive the job to report its exit status."""
        self.entered.add(pid)

    def listen_inside(self) -> socket.socket:
        """A TCP socket listening on 127.0.0.1 of the sandbox's network namespace, at a free
        port, for the runner to accept on from outside (`sf.tracking.Forwarder`). Made there
        by a short helper entered into the namespace alone with `nsenter --net` (Python 3.11
        has no `os.setns`), which passes the descriptor back over a socket pair."""
        ours, theirs = socket.socketpair()
        with ours, theirs:
            argv = ["nsenter", f"--target={self.anchor}", "--net", "--"]
            argv += [sys.executable, "-I", "-S", "-c", LISTEN_INSIDE, str(theirs.fileno())]
            try:
                done = subprocess.run(
                    argv,
                    pass_fds=[theirs.fileno()],
                    env={"PATH": TOOLS_PATH},
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=READY_TIMEOUT_S,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SandboxError(f"cannot listen inside the sandbox: {exc}") from exc
            if done.returncode != 0:
                why = done.stderr.decode(errors="replace").strip()[-300:]
                raise SandboxError(f"cannot listen inside the sandbox: {why}")
            ours.settimeout(READY_TIMEOUT_S)
            try:
                _msg, fds, _flags, _addr = socket.recv_fds(ours, 64, 1)
            except OSError as exc:
                raise SandboxError(f"cannot listen inside the sandbox: {exc}") from exc
        if len(fds) != 1:
            raise SandboxError("cannot listen inside the sandbox: no socket came back")
        return socket.socket(fileno=fds[0])

    def helpers(self) -> set[int]:
        """The processes that are the sandbox, not the job: never sent a stop's SIGTERM."""
        pids = {self.holder.pid, self.anchor, *self.entered, *_children(self.holder.pid)}
        if self.net is not None:
            pids.update((self.net.pid, *_children(self.net.pid)))  # nsenter, then pasta
        return pids

    def close(self) -> None:
        """End the sandbox: SIGKILL to its init ends every process left in the namespace,
        then the network helper goes. Safe to call twice."""
        for pid in _children(self.holder.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for proc in (self.holder, self.net):
            if proc is None:
                continue
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
                proc.wait(timeout=READY_TIMEOUT_S)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
            return [int(p) for p in handle.read().split()]
    except (OSError, ValueError):
        return []


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _wait_for_anchor(holder: subprocess.Popen) -> int:
    """The anchor's pid once it runs: bwrap's init has set every mount up and exec'd it."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if holder.poll() is not None:
            raise SandboxError(f"bwrap exited with {holder.returncode} before the job started")
        for init in _children(holder.pid):
            for pid in _children(init):
                if _comm(pid) == "sleep":
                    return pid
        time.sleep(POLL_S)
    raise SandboxError(f"the sandbox was not up within {READY_TIMEOUT_S:.0f} s")


def _wait_for_file(path: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SandboxError(f"{what} exited with {proc.returncode} before the job started")
        with contextlib.suppress(OSError):
            if os.path.getsize(path) > 0:
                return
        time.sleep(POLL_S)
    raise SandboxError(f"{what} was not up within {READY_TIMEOUT_S:.0f} s")
