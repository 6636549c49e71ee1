"""Owns the client's HTTP transport: a minimal JSON client on the standard library.

No `requests`: CLI start-up time matters, and the job-side runner must not depend on
anything beyond the standard library.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import IO, Any
from urllib.parse import urlencode, urlsplit

CHUNK = 256 * 1024
USER_AGENT = "starforge-client/0.1.0"


class ApiError(Exception):
    """The server answered with a 4xx/5xx status; `detail` is its sentence for humans."""

    def __init__(
        self, status: int, detail: str, body: Any = None, retry_after: float | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.body = body
        self.retry_after = retry_after  # seconds, from a Retry-After header in seconds


def _retry_after(resp: http.client.HTTPResponse) -> float | None:
    raw = resp.getheader("Retry-After") or ""
    try:
        value = float(raw)
    except ValueError:
        return None  # absent, or an HTTP date: the caller's own backoff applies
    return value if 0 <= value < float("inf") else None


# The runner retries what may go away by itself; the CLI reports every refusal at once.
RETRY_AFTER_CAP_S = 30.0  # a server's Retry-After is honoured up to this


def retryable(exc: ApiError) -> bool:
    """Whether a refusal may go away by itself: a server error, a timeout, too many requests."""
    return exc.status >= 500 or exc.status in (408, 429)


def retry_delay(exc: ApiError, default: float) -> float:
    """The server's Retry-After (capped) where it sent one, else our own backoff."""
    after = getattr(exc, "retry_after", None)
    return default if after is None else min(float(after), RETRY_AFTER_CAP_S)


class ConnectError(Exception):
    """The server could not be reached at all (DNS, refused, reset, timeout)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the Starforge server at {url}: {reason}")
        self.url = url


def _detail(status: int, reason: str, raw: bytes) -> tuple[str, Any]:
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    if detail is None:
        # Validation errors may come as a dict/list of field messages; still show them.
        detail = json.dumps(body) if body is not None else f"HTTP {status} {reason}".strip()
    elif not isinstance(detail, str):
        detail = json.dumps(detail)
    return detail, body


class Client:
    """JSON client bound to one server URL and (optionally) one bearer token."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"invalid server URL {base_url!r}: expected http(s)://host[:port]")
        self.base_url = base_url.rstrip("/")
        self._parts = parts
        self.token = token
        self.timeout = timeout

    def _connect(self) -> http.client.HTTPConnection:
        cls = (
            http.client.HTTPSConnection
            if self._parts.scheme == "https"
            else http.client.HTTPConnection
        )
        return cls(self._parts.hostname, self._parts.port, timeout=self.timeout)

    def _target(self, path: str, query: dict | None) -> str:
        target = self._parts.path + path
        clean = {k: v for k, v in (query or {}).items() if v is not None}
        return f"{target}?{urlencode(clean)}" if clean else target

    def _headers(self, extra: dict | None = None) -> dict:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        return headers

    def request(
        self, method: str, path: str, *, query: dict | None = None, json_body: Any = None
    ) -> Any:
        """Send one request and return the decoded JSON answer (None for an empty body)."""
        body = None if json_body is None else json.dumps(json_body).encode()
        headers = self._headers({"Content-Type": "application/json"} if body is not None else None)
        conn = self._connect()
        try:
            conn.request(method, self._target(path, query), body=body, headers=headers)
            return self._finish(conn)
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectError(self.base_url, _why(exc)) from exc
        finally:
            conn.close()

    def upload(
        self,
        path: str,
        fileobj: IO[bytes],
        size: int,
        content_type: str,
        on_progress: Callable[[int], None] | None = None,
    ) -> Any:
        """POST a raw body streamed from `fileobj` in chunks, reporting bytes sent."""
        conn = self._connect()
        try:
            conn.putrequest("POST", self._target(path, None), skip_accept_encoding=True)
            for key, value in self._headers({"Content-Type": content_type}).items():
                conn.putheader(key, value)
            conn.putheader("Content-Length", str(size))
            conn.endheaders()
            while chunk := fileobj.read(CHUNK):
                conn.send(chunk)
                if on_progress:
                    on_progress(len(chunk))
            return self._finish(conn)
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectError(self.base_url, _why(exc)) from exc
        finally:
            conn.close()

    def download(self, path: str, fileobj: IO[bytes]) -> int:
        """GET a raw body into `fileobj`; returns the byte count."""
        conn = self._connect()
        try:
            conn.request("GET", self._target(path, None), headers=self._headers())
            resp = conn.getresponse()
            if resp.status >= 300:
                detail, body = _detail(resp.status, resp.reason, resp.read())
                raise ApiError(resp.status, detail, body, _retry_after(resp))
            total = 0
            while chunk := resp.read(CHUNK):
                fileobj.write(chunk)
                total += len(chunk)
            return total
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectError(self.base_url, _why(exc)) from exc
        finally:
            conn.close()

    def _finish(self, conn: http.client.HTTPConnection) -> Any:
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status >= 300:
            detail, body = _detail(resp.status, resp.reason, raw)
            raise ApiError(resp.status, detail, body, _retry_after(resp))
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(resp.status, "the server sent a response that is not JSON") from exc


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
