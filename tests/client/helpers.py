"""What the client tests share, imported by them and by their conftest (never one test module
from another): a stdlib fake API server, `sf` run in this process, a job as the API answers it,
and the runner run for real on a packed snapshot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sf import snapshot

Route = Callable[["Request"], tuple[int, Any]]


class Request:
    """What a fake route sees: method, path, query (single values), headers and raw body."""

    def __init__(self, method: str, path: str, query: dict, headers: Any, body: bytes) -> None:
        self.method, self.path, self.query, self.headers, self.body = (
            method,
            path,
            query,
            headers,
            body,
        )

    def json(self) -> Any:
        return json.loads(self.body)


class FakeApi:
    """Routes keyed by "METHOD /path"; a route returns (status, JSON-able object or bytes)."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[Request] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def route(self, key: str, fn: Route) -> None:
        self.routes[key] = fn

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                req = Request(
                    self.command, parts.path, query, self.headers, self.rfile.read(length)
                )
                api.requests.append(req)
                fn = api.routes.get(f"{self.command} {parts.path}")
                status, body = fn(req) if fn else (404, {"detail": "no such route."})
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(raw)))
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def run_cli(argv: list[str]) -> int:
    """`sf ARGV` in this process; an argparse usage error comes back as its exit code."""
    from sf import cli

    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


# A job as the API answers it.
JOB = {
    "id": 7,
    "name": "demo",
    "run_id": "r7",
    "team": "vision",
    "user": "ada",
    "cluster": "local",
    "backend": "local",
    "status": "RUNNING",
    "status_reason": "",
    "attempt": 1,
    "retry_count": 0,
    "job_ref": "pid 1",
    "total_gpus": 2,
    "gpus": 2,
    "virtual_gpus": True,
}


def pack(tmp_path: Path, files: dict[str, str]) -> tuple[str, bytes]:
    src = tmp_path / "src"
    src.mkdir()
    for rel, text in files.items():
        (src / rel).write_text(text)
    snap = snapshot.build(str(src))
    data = Path(snap.path).read_bytes()
    snap.close()
    return snap.sha256, data


def runner_env(tmp_path: Path, url: str, sha: str, argv: list[str]) -> dict[str, str]:
    attempt = tmp_path / "attempt-1"
    attempt.mkdir()
    return {
        **os.environ,
        "SF_API_URL": url,
        "SF_JOB_TOKEN": "job-tok",
        "SF_JOB_ID": "7",
        "SF_RUN_ID": "r7",
        "SF_ATTEMPT": "1",
        "SF_RUN_DIR": str(attempt / "work"),
        "SF_OUTPUT_DIR": str(tmp_path / "out"),
        "SF_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "SF_ENTRYPOINT": json.dumps(argv),
        "SF_SNAPSHOT": sha,
        "SF_EXIT_FILE": str(attempt / "exit.json"),
        "SF_STARTED_FILE": str(attempt / "started.json"),
    }


def run_runner(env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sf.runner"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)


def exit_record(env: dict[str, str]) -> dict:
    return json.loads(Path(env["SF_EXIT_FILE"]).read_text())
