"""Owns the in-job metrics SDK: `sf.log(...)` and `sf.log_validation(...)`.

Under Starforge the runner sets SF_METRICS_FILE; points are buffered here and appended to that
file as JSON lines, which the runner tails and ships with the job-scoped token. The training
process never talks to the network, so a slow or unreachable server cannot stall a step.
Standard library only: this is imported inside arbitrary training images, and needs no install
there: the runner puts a copy of this package last on every rank's PYTHONPATH
(`sf.environment.install_sdk`), so a job with an `sf` of its own keeps it.

The file is a contract any language can write (this module is one writer of it):

- its path is the job's SF_METRICS_FILE; open it for appending (O_APPEND, created 0644 if
  missing) and append whole lines, each ending in "\n", with one write() per batch of lines,
  so that the runner, which reads only up to the last newline, never sees half a line;
- a line is one JSON object: {"kind": "train" | "validation", "name": str (1 to 100
  characters), "step": int >= 0, "value": finite number, "ts": seconds since the epoch, a
  finite number}; e.g. {"kind":"train","name":"loss","step":120,"value":0.31,"ts":1765100000.5};
- a line that is not such an object is skipped (the runner says how many at the end), never
  a reason to drop the others; NaN and Infinity are not JSON and are skipped too;
- points are shipped in the order written, each once; the per-attempt metric cap applies, and
  the file is read until the job's last process has exited, so a final flush counts.
"""

from __future__ import annotations

import atexit
import json
import math
import numbers
import os
import threading
import time
import warnings
from collections.abc import Mapping

from sf.contract import METRICS_FILE_VAR

ENV_FILE = METRICS_FILE_VAR
KINDS = ("train", "validation")  # mirrors the server's MetricKind but system: test_mirrors.py
MAX_NAME = 100  # mirrors jobs.stores.metrics.ingest.MAX_NAME: tests/client/test_mirrors.py
FLUSH_INTERVAL_S = 0.5
FLUSH_AT_POINTS = 200


def check_points(metrics: object, step: object) -> list[tuple[str, float]]:
    """The (name, value) pairs of `metrics`, or ValueError with a sentence saying what is wrong.

    Bad types raise ValueError too: callers get one exception for "this cannot be logged".
    """
    if not isinstance(metrics, Mapping):
        raise ValueError(  # noqa: TRY004
            f"metrics must be a dict of name -> number, not {type(metrics).__name__}"
        )
    if step is not None and (type(step) is not int or step < 0):
        raise ValueError(f"step must be a non-negative int, not {step!r}")
    points = []
    for name, value in metrics.items():
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise ValueError(
                f"metric name {name!r} must be a non-empty string of at most {MAX_NAME} characters"
            )
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(  # noqa: TRY004
                f"metric {name!r} must be a number, not {type(value).__name__} "
                "(for a tensor, log tensor.item())"
            )
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"metric {name!r} is {number}; only finite numbers can be logged")
        points.append((name, number))
    return points


class MetricsWriter:
    """Buffers points and appends them to one file, each flush a single O_APPEND write."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.buffer: list[str] = []
        self.next_step = dict.fromkeys(KINDS, 0)
        self.warned = False
        self.pid = os.getpid()
        self.flusher: threading.Thread | None = None

    def log(self, kind: str, metrics: Mapping[str, float], step: int | None) -> None:
        points = check_points(metrics, step)
        if self.path is None:
            self._warn_once()
            return
        with self.lock:
            self._after_fork()
            used = self.next_step[kind] if step is None else step
            self.next_step[kind] = used + 1
            ts = time.time()
            for name, value in points:
                point = {"kind": kind, "name": name, "step": used, "value": value, "ts": ts}
                self.buffer.append(json.dumps(point, separators=(",", ":")) + "\n")
            full = len(self.buffer) >= FLUSH_AT_POINTS
            self._start_flusher()
        if full:
            self.flush()

    def flush(self) -> None:
        # The lock stays held over the write so two flushes cannot reorder points.
        with self.lock:
            if not self.buffer or self.path is None or os.getpid() != self.pid:
                return
            payload = "".join(self.buffer).encode()
            self.buffer.clear()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, payload)
                while written < len(payload):  # a short write: rare on regular files
                    written += os.write(fd, payload[written:])
            finally:
                os.close(fd)

    def _after_fork(self) -> None:
        # A forked child (e.g. a data-loader worker) inherits the parent's unflushed points
        # but not its flusher thread: drop the copies, or they would be written twice.
        if os.getpid() != self.pid:
            self.pid, self.flusher = os.getpid(), None
            self.buffer.clear()

    def _start_flusher(self) -> None:
        if self.flusher is None:
            self.flusher = threading.Thread(target=self._flush_loop, name="sf-metrics", daemon=True)
            self.flusher.start()

    def _flush_loop(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL_S)
            try:
                self.flush()
            except OSError as exc:
                warnings.warn(f"sf: cannot write metrics to {self.path}: {exc}", stacklevel=1)
                return

    def _warn_once(self) -> None:
        with self.lock:
            if self.warned:
                return
            self.warned = True
        warnings.warn(
            f"sf.log: not running under Starforge ({ENV_FILE} is not set); metrics are not "
            "recorded",
            stacklevel=4,
        )


_writer: MetricsWriter | None = None
_writer_lock = threading.Lock()


def _default_writer() -> MetricsWriter:
    global _writer
    with _writer_lock:
        if _writer is None:
            _writer = MetricsWriter(os.environ.get(ENV_FILE) or None)
            atexit.register(_writer.flush)
        return _writer


def log(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Record training metrics, e.g. `sf.log({"loss": 0.31, "lr": 3e-4}, step=120)`.

    Without `step`, the step after the previous training call's is used (0 for the first).
    """
    _default_writer().log("train", metrics, step)


def log_validation(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Record validation/eval metrics, e.g. `sf.log_validation({"accuracy": 0.91}, step=1000)`."""
    _default_writer().log("validation", metrics, step)
