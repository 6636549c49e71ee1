"""Network namespaces a test makes for itself: a peer host at the end of a veth pair.

Network tests send traffic only to loopback or to namespaces they create, never to this
machine's own addresses or anything outside. A `Peer` is such a host: a namespace with one
address, joined to this host by a veth pair whose near end gets an address too (an address of
this host the test made). Servers run inside it with `Peer.serve`; everything is removed on
exit, whatever failed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

# A server that greets every connection with one line: a probe that reads it has reached it
# (a connect alone proves nothing: pasta may accept a connection before its far end answers).
BANNER_SERVER = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen()
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(sys.argv[3].encode() + b"\\n")
    conn.close()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Peer:
    """A namespace `name` at `peer_addr`, reached from this host's `near_addr` (a /24)."""

    def __init__(self, name: str, near_addr: str, peer_addr: str) -> None:
        self.name, self.near_addr, self.addr = name, near_addr, peer_addr
        self.link = f"v{os.getpid() % 100000}{name[-4:]}"[:15]
        self.servers: list[subprocess.Popen] = []

    def up(self) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self.link, "type", "veth", "peer", "name", "peer0", "netns", self.name)
        _ip("addr", "add", f"{self.near_addr}/24", "dev", self.link)
        _ip("link", "set", self.link, "up")
        for args in (
            ("addr", "add", f"{self.addr}/24", "dev", "peer0"),
            ("link", "set", "peer0", "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("-n", self.name, *args)

    def serve(self, port: int, banner: str, *, here: bool = False) -> None:
        """A banner server on the peer's address, or (`here`) on this host's near end."""
        argv = [sys.executable, "-c", BANNER_SERVER]
        if here:
            argv += [self.near_addr, str(port), banner]
        else:
            argv = ["ip", "netns", "exec", self.name, *argv, self.addr, str(port), banner]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.servers.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"

    def down(self) -> None:
        for proc in self.servers:
            proc.kill()
            proc.wait()
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", self.link)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", self.name)


@contextlib.contextmanager
def peer(name: str, near_addr: str, peer_addr: str) -> Iterator[Peer]:
    host = Peer(f"{name}-{os.getpid()}", near_addr, peer_addr)
    try:
        host.up()
        yield host
    finally:
        host.down()


def banner_server_here(port: int, banner: str) -> subprocess.Popen:
    """A banner server on this host's loopback: a stand-in for a service of the host."""
    proc = subprocess.Popen(
        [sys.executable, "-c", BANNER_SERVER, "127.0.0.1", str(port), banner],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    return proc


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
