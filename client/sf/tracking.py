"""Owns the job's way to Starforge's MLflow tracking endpoint (the server's `TRACKING_PATH`):
the two MLflow variables every rank gets (`tracking_env`), and, where the job is sandboxed and
has no path to the API (`sf.sandbox`: the host's firewall keeps it off every address of this
host), the forwarder the runner serves inside the job's network namespace (`Forwarder`).

The forwarder listens on 127.0.0.1 inside the sandbox (the socket is made there: `sf.sandbox`
`Sandbox.listen_inside`) and the runner's thread accepts on it from outside, so each request is
forwarded from the runner's own network to the API URL the runner already uses. It passes only
what MLflow's client sends to the tracking endpoint: GET or POST, a path below
`TRACKING_PATH + "/"` that no normalisation can lead out of it, a bounded header and body, an
allow-list of headers (the job's own credential among them, never the runner's). Anything else
is answered here with MLflow's error shape and never reaches the server. Everything a job sends
is hostile input: a malformed request ends its connection with a 400, a slow one with its
timeout, and a stop never waits for a connection (the threads are daemons; `close` ends the
listener).

Standard library only, like the rest of the runner.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
from typing import IO
from urllib.parse import urlsplit

from sf.contract import TRACKING_PATH, TRACKING_TOKEN_VAR, TRACKING_URI_VAR, tracking_token

MAX_BODY = 32 << 20  # MLflow's log_batch is 1000 metrics; artifacts are not proxied in bulk
MAX_HEADER = 64 << 10  # the request line and every header together
MAX_CONNECTIONS = 64  # at once; more are answered 503 at once
IDLE_TIMEOUT_S = 120.0  # a connection that sends nothing for this long is closed
UPSTREAM_TIMEOUT_S = 120.0
CHUNK = 256 << 10
METHODS = ("GET", "POST")
# The request headers passed on; the rest (Host, Cookie, X-Forwarded-*, Connection, the
# job's Accept-Encoding) stay here: the server sees the runner as the client.
PASSED_ON = ("content-type", "authorization", "accept", "user-agent")
ANSWERED = ("content-type", "retry-after")
# What could make a server's normalisation leave TRACKING_PATH: dot segments, encoded dots,
# slashes and backslashes, empty segments.
_ESCAPES = re.compile(r"%2e|%2f|%5c|%00|\\|//", re.IGNORECASE)


def direct_uri(api_url: str) -> str:
    """The tracking URI where the job reaches the API itself (no sandbox in the way)."""
    return api_url.rstrip("/") + TRACKING_PATH


def tracking_env(api_url: str, job_token: str, job_env: dict[str, str]) -> dict[str, str]:
    """MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN for a job whose environment is `job_env`:
    none offline (no API) or without a job token, and none where the job named its own
    tracking server (then its own token, if any, is its own business too)."""
    if not api_url or not job_token or TRACKING_URI_VAR in job_env:
        return {}
    try:
        token = tracking_token(job_token)
    except ValueError:  # not a job token's shape (<job>.<attempt>.<nonce>): no credential
        return {}
    return {TRACKING_URI_VAR: direct_uri(api_url), TRACKING_TOKEN_VAR: token}


def allowed(method: str, target: str) -> bool:
    """Whether a request may reach the server: GET or POST below the tracking root, by a path
    that stays there however the server normalises it."""
    path = target.split("?", 1)[0]
    if method not in METHODS or not path.startswith(TRACKING_PATH + "/"):
        return False
    if _ESCAPES.search(path) or not target.isascii() or not target.isprintable():
        return False
    return not any(part in (".", "..") for part in path.split("/"))


class BadRequest(Exception):
    """The job sent something that is no acceptable HTTP request: answered, then closed."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class Request:
    """One request as read from the job: method, target, the headers passed on, the body."""

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self.method, self.target, self.headers, self.body = method, target, headers, body
        self.close = headers.pop("connection", "").lower() == "close"


def read_request(stream: IO[bytes]) -> Request | None:
    """The next request on a connection, None when the job closed it between requests."""
    line = stream.readline(MAX_HEADER + 1)
    if not line:
        return None
    used = len(line)
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, "BAD_REQUEST", "a request line is METHOD TARGET HTTP/1.x")
    headers: dict[str, str] = {}
    while True:
        raw = stream.readline(MAX_HEADER + 1)
        used += len(raw)
        if used > MAX_HEADER:
            raise BadRequest(431, "BAD_REQUEST", f"headers over {MAX_HEADER} bytes")
        if raw in (b"\r\n", b"\n", b""):
            break
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep:
            raise BadRequest(400, "BAD_REQUEST", "a header line without a colon")
        headers[name.strip().lower()] = value.strip()
    return Request(parts[0], parts[1], headers, _body(stream, headers))


def _body(stream: IO[bytes], headers: dict[str, str]) -> bytes:
    if "transfer-encoding" in headers:
        raise BadRequest(411, "BAD_REQUEST", "send the body with a Content-Length")
    raw = headers.pop("content-length", "0") or "0"
    if not raw.isdigit():
        raise BadRequest(400, "BAD_REQUEST", "Content-Length is not a number")
    length = int(raw)
    if length > MAX_BODY:
        raise BadRequest(413, "RESOURCE_LIMIT_EXCEEDED", f"a body over {MAX_BODY} bytes")
    body = stream.read(length) if length else b""
    if len(body) != length:
        raise BadRequest(400, "BAD_REQUEST", "the body ended before its Content-Length")
    return body


def error_answer(status: int, code: str, message: str) -> bytes:
    """A whole HTTP answer in MLflow's error shape; the connection closes after it."""
    body = json.dumps({"error_code": code, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status} {http.client.responses.get(status, 'Error')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class Forwarder:
    """Accepts the job's connections on `listener` (inside its sandbox) and forwards the
    tracking requests to `api_url`, from the runner's side."""

    def __init__(self, listener: socket.socket, api_url: str) -> None:
        self.listener = listener
        parts = urlsplit(api_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"invalid API URL {api_url!r}")
        self.parts, self.host = parts, parts.hostname
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="sf-tracking", daemon=True)

    @property
    def uri(self) -> str:
        """The job's MLFLOW_TRACKING_URI: this listener, inside its network namespace."""
        host, port = self.listener.getsockname()[:2]
        return f"http://{host}:{port}{TRACKING_PATH}"

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        """Stop accepting; connections in progress end with the runner (daemon threads)."""
        self.closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _addr = self.listener.accept()
            except OSError:
                return  # closed
            if not self.slots.acquire(blocking=False):
                _answer_and_close(conn, error_answer(503, "TEMPORARILY_UNAVAILABLE", "busy"))
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(IDLE_TIMEOUT_S)
            stream = conn.makefile("rb")
            while not self.closed.is_set():
                try:
                    request = read_request(stream)
                except BadRequest as exc:
                    conn.sendall(error_answer(exc.status, exc.code, str(exc)))
                    return
                if request is None:
                    return
                if not allowed(request.method, request.target):
                    message = f"{request.method} {request.target[:200]} is not served here"
                    conn.sendall(error_answer(404, "ENDPOINT_NOT_FOUND", message))
                    return
                if not self._forward(conn, request) or request.close:
                    return
        except (OSError, http.client.HTTPException):
            return  # the job went away or was too slow, or the server's answer broke off
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            self.slots.release()

    def _connect(self) -> http.client.HTTPConnection:
        https = self.parts.scheme == "https"
        kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
        return kind(self.host, self.parts.port, timeout=UPSTREAM_TIMEOUT_S)

    def _forward(self, conn: socket.socket, request: Request) -> bool:
        """Send `request` on and its answer back; False when the connection must close. A
        connection to the server per request: one the server closed while idle could not be
        told from a lost answer, and a POST must not be sent twice."""
        headers = {k: v for k, v in request.headers.items() if k in PASSED_ON}
        headers["content-length"] = str(len(request.body))
        upstream = self._connect()
        try:
            upstream.request(
                request.method,
                self.parts.path + request.target,
                body=request.body,
                headers=headers,
            )
            answer = upstream.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            message = f"the Starforge server could not be reached: {exc or type(exc).__name__}"
            conn.sendall(error_answer(502, "TEMPORARILY_UNAVAILABLE", message))
            upstream.close()
            return False
        try:
            return _relay(conn, answer)
        finally:
            upstream.close()


def _relay(conn: socket.socket, answer: http.client.HTTPResponse) -> bool:
    """The server's answer to the job, streamed: kept alive where its length is known."""
    length = answer.getheader("Content-Length")
    keep = length is not None and length.isdigit()
    head = [f"HTTP/1.1 {answer.status} {answer.reason}"]
    head += [f"{k}: {v}" for k, v in answer.getheaders() if k.lower() in ANSWERED]
    head.append(f"Content-Length: {length}" if keep else "Connection: close")
    conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    while chunk := answer.read(CHUNK):
        conn.sendall(chunk)
    return keep


def _answer_and_close(conn: socket.socket, answer: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.settimeout(1.0)
        conn.sendall(answer)
    with contextlib.suppress(OSError):
        conn.close()
