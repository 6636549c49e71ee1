"""Owns what the runner sends the server while the job runs: the job's output lines, numbered
across both streams and every rank and fanned out to the echo, console.log and the log shipper;
the SDK's metric points tailed from SF_METRICS_FILE (with the runner's own samples) into the
metrics shipper; both shipped in batches that are retried, never dropped, while the server may
still take them; and the start report that starts the attempt's billing.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import threading
import time
from typing import IO, Any

from sf.http import ApiError, Client, ConnectError, retry_delay, retryable
from sf.metrics import KINDS, MAX_NAME
from sf.say import say

# Lines per log request at most. A request costs the server far more than a line in it, so a
# chatty job is held back by requests, not lines: large batches let it log fast (`make bench`
# measures it). A quiet job sends every 0.2 s.
BATCH_LINES = 5000
BATCH_POINTS = 2000
METRICS_POLL_S = 0.25
BATCH_INTERVAL_S = 0.2  # a line reaches the console well under 300 ms
MAX_BACKOFF_S = 5.0
FLUSH_GIVE_UP_S = 30.0
READ_CHUNK = 64 * 1024  # longer lines are split so one runaway line cannot exhaust memory


class BatchShipper:
    """Buffers seq-numbered records and POSTs them in batches; never drops one while it can retry.

    One per channel (log lines, metric points): the server dedupes by (attempt, seq), so a batch
    resent after a lost answer is harmless, and a 409 carrying `next_seq` skips what it has.
    """

    path = ""  # the ingest endpoint
    field = ""  # the body's list: {"attempt": N, field: [...]}
    what = ""  # for messages
    batch_max = 0

    def __init__(self, client: Client | None, attempt: int) -> None:
        self.client, self.attempt = client, attempt
        self.buffer: list[dict] = []
        self.cond = threading.Condition()
        self.closing_at: float | None = None
        self.stopped = client is None
        self.limit = self.batch_max  # lowered while the server answers 413 (batch too large)
        self.retry_after = 0.0  # the server's Retry-After on its last refusal, capped
        self.thread = threading.Thread(target=self._loop, name=f"sf-{self.field}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def add(self, record: dict) -> None:
        with self.cond:
            if self.stopped:
                return
            self.buffer.append(record)
            if len(self.buffer) >= self.batch_max:
                self.cond.notify()

    def close(self, timeout: float = FLUSH_GIVE_UP_S + 10) -> None:
        """Flush what is left, giving up after FLUSH_GIVE_UP_S of failed resends."""
        self.begin_close()
        self.join(timeout)

    def begin_close(self) -> None:
        with self.cond:
            self.closing_at = time.monotonic()
            self.cond.notify()

    def join(self, timeout: float = FLUSH_GIVE_UP_S + 10) -> None:
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _loop(self) -> None:
        backoff, failing_since = 0.0, None
        while True:
            batch = self._next_batch(backoff)
            if batch is None:
                return
            ok = self._send(batch)
            if ok:
                backoff, failing_since = 0.0, None
                continue
            failing_since = failing_since or time.monotonic()
            backoff = max(min(MAX_BACKOFF_S, backoff * 2 or 0.25), self.retry_after)
            self.retry_after = 0.0
            if self._give_up(failing_since):
                return

    def _next_batch(self, backoff: float) -> list[dict] | None:
        with self.cond:
            if not self.stopped and self.closing_at is None:
                wait = backoff or BATCH_INTERVAL_S
                if backoff or len(self.buffer) < self.batch_max:
                    self.cond.wait(wait)
            elif backoff:
                self.cond.wait(backoff)  # closing: keep the backoff, but no batching delay
            if self.stopped or (self.closing_at is not None and not self.buffer):
                return None
            return list(self.buffer[: self.limit])

    def _give_up(self, failing_since: float) -> bool:
        with self.cond:
            if self.closing_at is None:
                return False
            if time.monotonic() - max(failing_since, self.closing_at) < FLUSH_GIVE_UP_S:
                return False
            lost = len(self.buffer)
            self.stopped = True
        say(f"gave up shipping {lost} {self.what} after {FLUSH_GIVE_UP_S:.0f}s of failures")
        return True

    def _send(self, batch: list[dict]) -> bool:
        if not batch:
            return True
        body = {"attempt": self.attempt, self.field: batch}
        try:
            self.client.request("POST", self.path, json_body=body)  # type: ignore
        except ConnectError:
            return False
        except ApiError as exc:
            return self._on_error(exc, batch)
        self._drop_below(batch[-1]["seq"] + 1)
        self.limit = min(self.batch_max, self.limit * 2)
        return True

    def _on_error(self, exc: ApiError, batch: list[dict]) -> bool:
        if retryable(exc):
            self.retry_after = retry_delay(exc, 0.0)
            return False
        if exc.status == 413:
            if len(batch) > 1:
                self.limit = max(1, len(batch) // 2)  # resend in smaller batches at once
                return True
            self._drop_below(batch[0]["seq"] + 1)  # one record larger than any batch allowed
            say(f"dropped one of the {self.what} (seq {batch[0]['seq']}): {exc.detail}")
            return True
        next_seq = exc.body.get("next_seq") if isinstance(exc.body, dict) else None
        if exc.status == 409 and isinstance(next_seq, int) and next_seq > batch[0]["seq"]:
            self._drop_below(next_seq)  # server already has these; continue after them
            return True
        self._stop(f"shipping {self.what} stopped: HTTP {exc.status}: {exc.detail}")
        return True

    def _drop_below(self, seq: int) -> None:
        # The buffer is in seq order, so only a prefix can be dropped; no full rebuild per batch.
        with self.cond:
            count = 0
            while count < len(self.buffer) and self.buffer[count]["seq"] < seq:
                count += 1
            del self.buffer[:count]

    def _stop(self, message: str) -> None:
        with self.cond:
            self.stopped = True
            self.buffer.clear()
        say(message)


class LogShipper(BatchShipper):
    path, field, what, batch_max = "/api/v1/ingest/logs", "lines", "log lines", BATCH_LINES


class MetricsShipper(BatchShipper):
    path, field, what, batch_max = "/api/v1/ingest/metrics", "points", "metric points", BATCH_POINTS


class MetricsTail:
    """Follows the SDK's metrics file (SF_METRICS_FILE), numbering points into a shipper.

    The SDK appends whole lines with one write each, so a line without its newline is still
    being written: it is left for the next read. Lines that are not valid points (user code may
    write to the file too) are skipped with one message, never sent to fail a whole batch.
    Points the runner makes itself (system samples) join the same numbering through `add`; the
    file cannot carry them, so job code cannot forge them.
    """

    def __init__(self, path: str, shipper: BatchShipper, owner: int | None = None) -> None:
        self.path, self.shipper = path, shipper
        self.owner = owner  # the job's uid when it is not ours: the file must be its own
        self.offset, self.seq, self.skipped = 0, 0, 0
        self.pending = b""
        self.lock = threading.Lock()  # seq order must equal the shipper's buffer order
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="sf-metrics-tail", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Read what the job wrote last (its exit-time flush included), then stop."""
        self.done.set()
        self.thread.join()
        self.read_new()
        if self.skipped:
            say(f"skipped {self.skipped} lines of {self.path} that were not metric points")

    def _loop(self) -> None:
        while not self.done.wait(METRICS_POLL_S):
            self.read_new()

    def add(self, point: dict) -> None:
        """Number one point (without seq) into the shipper, after those already numbered."""
        with self.lock:
            self.shipper.add({"seq": self.seq, **point})
            self.seq += 1

    def read_new(self) -> None:
        data = self._read_from_offset()
        if data is None:
            return
        self.offset += len(data)
        *lines, self.pending = (self.pending + data).split(b"\n")
        for raw in lines:
            point = parse_point(raw)
            if point is None:
                self.skipped += 1
                continue
            self.add(point)

    def _read_from_offset(self) -> bytes | None:
        """What the job appended since the last read, or None when the file is missing or is
        not the job's own regular file (a root runner must not follow a job's symlink or
        hard link to a file it could not read itself, nor block on a FIFO)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None
            if self.owner is not None and info.st_uid != self.owner:
                return None
            fh.seek(self.offset)
            return fh.read()


def parse_point(raw: bytes) -> dict | None:
    """One SDK line as the ingest API takes it, or None when it is not a valid point."""
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(line, dict):
        return None
    kind, name, step, value, ts = (line.get(k) for k in ("kind", "name", "step", "value", "ts"))
    if not (
        kind in KINDS
        and isinstance(name, str)
        and 0 < len(name) <= MAX_NAME
        and type(step) is int
        and step >= 0
        and type(value) in (int, float)
        and math.isfinite(value)
        and type(ts) in (int, float)
        and math.isfinite(ts)
    ):
        return None
    return {"kind": kind, "name": name, "step": step, "value": value, "ts": ts}


class LineSink:
    """Numbers lines across both streams (and every rank) and fans them out to echo,
    console.log and shipper. With `ranked`, each shipped line carries its rank; with `marked`
    (one runner, several ranks), console.log and the echo also show it as `[rank N]`."""

    def __init__(
        self, console: IO[str], shipper: BatchShipper, ranked: bool = False, marked: bool = False
    ) -> None:
        self.console, self.shipper = console, shipper
        self.ranked, self.marked = ranked, marked
        self.seq = 0
        self.lock = threading.Lock()

    def emit(self, stream: str, text: str, rank: int | None = None) -> None:
        with self.lock:
            line: dict[str, Any] = {
                "seq": self.seq,
                "stream": stream,
                "ts": time.time(),
                "text": text,
            }
            shown = text
            if self.ranked and rank is not None:
                line["rank"] = rank
                if self.marked:
                    shown = f"[rank {rank}] {text}"
            self.seq += 1
            echo = sys.stdout if stream == "stdout" else sys.stderr
            echo.write(shown + "\n")
            echo.flush()
            self.console.write(shown + "\n")
            self.console.flush()
            self.shipper.add(line)


def pump(pipe: IO[bytes], stream: str, sink: LineSink, rank: int | None = None) -> None:
    """One stream of one rank into `sink`, line by line, until the rank closes it."""
    with pipe:
        while raw := pipe.readline(READ_CHUNK):
            text = raw.decode("utf-8", errors="replace")
            sink.emit(stream, text.removesuffix("\n"), rank)


def report_started(client: Client | None, attempt: int) -> None:
    """Tell the server the entrypoint is up, now: metering starts here on every engine.

    Best effort, in the background: an engine that reports its own start time, or the
    reconciler's first sight of the job running, stands in when this does not arrive.
    """
    if client is None:
        return

    def send() -> None:
        delay = 0.0
        for backoff in (1.0, 3.0, 0.0):
            time.sleep(delay)
            try:
                client.request("POST", "/api/v1/ingest/started", json_body={"attempt": attempt})
                return
            except ConnectError:
                delay = backoff
            except ApiError as exc:
                if not retryable(exc):
                    return  # refused (attempt over, token wrong): nothing to retry
                delay = retry_delay(exc, backoff)

    threading.Thread(target=send, name="sf-started", daemon=True).start()
