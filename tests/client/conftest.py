"""Fixtures for the client tests: a stdlib fake API server. No Django, no database, no network."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

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


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    api = FakeApi()
    thread = threading.Thread(target=api.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield api
    api.server.shutdown()
    api.server.server_close()


@pytest.fixture
def sf_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Callable[[str], None]:
    """Point the CLI at a throwaway config file; call it with a URL to log in via env."""
    monkeypatch.setenv("SF_CONFIG", str(tmp_path / "sf-config.json"))
    monkeypatch.delenv("SF_URL", raising=False)
    monkeypatch.delenv("SF_TOKEN", raising=False)

    def login(url: str) -> None:
        monkeypatch.setenv("SF_URL", url)
        monkeypatch.setenv("SF_TOKEN", "tok")

    return login


def run_cli(argv: list[str]) -> int:
    """`sf ARGV` in this process; an argparse usage error comes back as its exit code."""
    from sf import cli

    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture
def sf(live_server, alice, monkeypatch, tmp_path, capsys) -> Callable[..., tuple[int, str, str]]:
    """`sf ARGS` as alice against the live server (a real Starforge): (exit code, stdout,
    stderr). Tests using it need `django_db(transaction=True)`: the server reads what they
    wrote."""
    from jobs.actions.tokens import issue_token

    monkeypatch.setenv("SF_CONFIG", str(tmp_path / "sf.json"))
    monkeypatch.setenv("SF_URL", live_server.url)
    monkeypatch.setenv("SF_TOKEN", issue_token(alice))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run_cli(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
