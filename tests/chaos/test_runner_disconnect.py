"""The runner losing the API for 30 s loses no log line and duplicates none.

A TCP proxy sits between the job's runner and the ASGI server (the cluster's `api_url` points at
it). While the job prints numbered lines, the proxy drops every open connection and refuses new
ones for 30 s -- a request may have reached the server whose answer never comes back, so the
runner resends lines the server already has -- and the job ends while the API is still away.
Afterwards the stored log holds every line exactly once, in order.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request

import pytest

from tests.e2e.stack import Redis, Stack, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

LINES = 300
JOB = (
    f"import time\nfor i in range({LINES}):\n"
    "    print(f'line {i}', flush=True)\n    time.sleep(0.1)"
)
CUT_S = 30


class CuttableProxy:
    """Forwards 127.0.0.1:port to a target port until cut; while cut, new connections are reset."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.cut = threading.Event()
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                client.close()  # RST: the connection is refused as a lost network would
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if self.cut.is_set():
                    break  # drop what was in flight: the answer may never come back
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def disconnect(self) -> None:
        self.cut.set()
        with self.lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self.open.clear()

    def reconnect(self) -> None:
        self.cut.clear()

    def close(self) -> None:
        self.closed = True
        self.disconnect()
        self.listener.close()


@pytest.fixture
def stack(tmp_path):
    redis = Redis()
    redis.start()
    stack = Stack(tmp_path, REDIS_URL=redis.url)
    try:
        yield stack.start()
    finally:
        stack.close()
        redis.kill()


def stored_lines(stack: Stack, job_id: int) -> list[str]:
    """Every stored line of the job, from the first, following the cursor to the end."""
    page = stack.api(f"/jobs/{job_id}/logs?tail=0")
    texts = [line["text"] for line in page["lines"]]
    while page["lines"]:
        page = stack.api(f"/jobs/{job_id}/logs?cursor={page['cursor']}")
        texts += [line["text"] for line in page["lines"]]
    return texts


def submit(stack: Stack, body: dict) -> dict:
    request = urllib.request.Request(
        f"{stack.url}/api/v1/jobs",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def test_a_30_second_disconnect_loses_and_duplicates_no_log_line(stack):
    proxy = CuttableProxy(stack.port)
    try:
        stack._manage("cluster", "set", "local", "--set", f"api_url=http://127.0.0.1:{proxy.port}")
        job = submit(stack, {"entrypoint": ["python3", "-c", JOB], "gpus": 0})
        wait_until(
            lambda: len(stored_lines(stack, job["id"])) >= 20,
            60,
            "the first lines to arrive through the proxy",
            stack.diagnostics,
            0.5,
        )
        proxy.disconnect()
        cut_at = time.monotonic()
        time.sleep(CUT_S)
        during = len(stored_lines(stack, job["id"]))
        proxy.reconnect()
        assert time.monotonic() - cut_at >= CUT_S
        assert during < LINES, "the cut came too late to matter"
        stack.wait_job(job["id"], lambda j: j["terminal"], 60, "the job to end")
    finally:
        proxy.close()

    texts = stored_lines(stack, job["id"])
    expected = [f"line {i}" for i in range(LINES)]
    missing = [t for t in expected if t not in set(texts)]
    assert texts == expected, (
        f"{len(texts)} lines stored; missing {missing[:10]}; "
        f"duplicates {len(texts) - len(set(texts))}"
    )
    assert stack.job(job["id"])["status"] == "SUCCEEDED"
