"""Owns the job-side runner (`python -m sf.runner`): ingest, run, ship logs and metrics, exit.

Executors start it with the SF_* environment; what both sides rely on (exit codes, file names,
how records are signed) is `sf.contract`. Standard library only: it runs inside arbitrary job
images. Exit `INGEST_EXIT` means ingest failed and the user's code never ran.

The job's code is hostile. The runner keeps its credentials (job token, record key) out of the
job's environment and makes itself non-dumpable, so a job of the same uid can neither read its
/proc environ nor ptrace it; it signs started.json and exit.json with SF_RECORD_KEY so a record
the job wrote decides nothing; it is a child subreaper and ends every process the job left
(setsid and double forks included) before it writes exit.json. With SF_RUN_AS_UID it stays root
and runs the job as that uid, with its own directories and nothing else of the attempt's.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from typing import IO, Any

from sf.checkpoints import CheckpointWatcher, write_notice
from sf.contract import (
    ARRAY_VARS,
    BOOTSTRAP_TOKEN_VAR,
    CONSOLE_LOG,
    DEFAULT_PREEMPT_GRACE_S,
    DEFAULT_STOP_GRACE_S,
    EXIT_FILE,
    EXIT_FILE_VAR,
    INGEST_EXIT,
    INGEST_FAILED,
    JOB_TOKEN_VAR,
    METRICS_FILE,
    NICENESS_VAR,
    NODE_RANK_VAR,
    NOTICE_FILE,
    NOTICE_FILE_VAR,
    PREEMPT_GRACE_VAR,
    PROC_FILE_VAR,
    RANK_GPUS_VAR,
    RANK_LAUNCH_VAR,
    RANK_VARS,
    RECORD_KEY_VAR,
    RUN_DIR,
    RUN_DIR_VAR,
    RUNNER_SECRETS,
    SANDBOX_VAR,
    STARTED_FILE,
    STARTED_FILE_VAR,
    STOP_GRACE_VAR,
    exit_status,
    record_mac,
)
from sf.http import ApiError, Client, ConnectError
from sf.ranks import RankPlan, RankPlanError, plan_ranks, rank_states, terminator
from sf.sandbox import Sandbox, SandboxConfig, SandboxError
from sf.supervise import Supervisor, guard_runner
from sf.system import SystemSampler, sample_interval

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
FETCH_TRIES = 4
RETRY_AFTER_CAP_S = 30.0  # a server's Retry-After is honoured up to this
# Names only the runner may see: its credentials, its own files, how it runs the job.
RUNNER_ONLY = RUNNER_SECRETS | frozenset(
    {
        BOOTSTRAP_TOKEN_VAR,
        EXIT_FILE_VAR,
        STARTED_FILE_VAR,
        PROC_FILE_VAR,
        "SF_API_URL",
        "SF_USER_ENV",
        "SF_RUN_AS_UID",
        "SF_RUN_AS_GID",
        "SF_RUN_AS_USER",
        RANK_LAUNCH_VAR,
        RANK_GPUS_VAR,
        STOP_GRACE_VAR,
        NICENESS_VAR,
        SANDBOX_VAR,
    }
)
# What a job sees of the contract when its own variables come apart (SF_USER_ENV).
CHILD_CONTRACT = (
    "SF_RUN_ID",
    "SF_ATTEMPT",
    "SF_JOB_ID",
    "SF_OUTPUT_DIR",
    "SF_CHECKPOINT_DIR",
    PREEMPT_GRACE_VAR,
    *ARRAY_VARS,
)
BASE_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME")


class IngestError(Exception):
    """Snapshot fetch/unpack or entrypoint resolution failed; the user's code must not run."""


class Terminated(Exception):
    """SIGTERM/SIGINT arrived before the child was spawned."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


# --- small file helpers ----------------------------------------------------------------


def write_json_atomic(path: str, data: dict) -> None:
    """Write JSON via tmp + rename so executors never read a half-written file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_record(path: str, record: dict, key: str) -> None:
    """A runner record, signed when the executor gave a record key."""
    write_json_atomic(path, {**record, "mac": record_mac(key, record)} if key else record)


def _retryable(exc: ApiError) -> bool:
    return exc.status >= 500 or exc.status in (408, 429)


def _retry_delay(exc: ApiError, default: float) -> float:
    """The server's Retry-After (capped) where it sent one, else our own backoff."""
    after = getattr(exc, "retry_after", None)
    return default if after is None else min(float(after), RETRY_AFTER_CAP_S)


def _say(message: str) -> None:
    sys.stderr.write(f"sf.runner: {message}\n")
    sys.stderr.flush()


# --- ingest --------------------------------------------------------------------------


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith("/") or ".." in parts:
        raise IngestError(f"unsafe path in snapshot: {name!r}")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise IngestError(f"unsupported member type in snapshot: {name!r}")
    if member.issym():
        target = os.path.normpath(os.path.join(os.path.dirname(name), member.linkname))
        if os.path.isabs(member.linkname) or target == ".." or target.startswith("../"):
            raise IngestError(f"symlink {name!r} points outside the snapshot")


def safe_unpack(archive: str, dest: str) -> None:
    """Unpack a .tar.gz into `dest`, refusing anything that could land outside it."""
    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                _check_member(member)
                _extract(tar, member, root)
        _check_links(root)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise IngestError(f"cannot unpack snapshot: {exc}") from exc


def _check_links(root: str) -> None:
    """Every symlink, now that all are in place, still resolves inside the run directory: two
    links can leave it together (`a -> c/..` with `c -> .`) though each looked inside alone."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not _inside(os.path.realpath(path), root):
                os.unlink(path)
                rel = os.path.relpath(path, root)
                raise IngestError(f"symlink {rel!r} resolves outside the run directory")


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, root: str) -> None:
    target = os.path.join(root, member.name)
    # Resolve the parent on disk: earlier in-tree symlinks could otherwise redirect us out.
    if not _inside(os.path.realpath(os.path.dirname(target)), root):
        raise IngestError(f"{member.name!r} would be written outside the run directory")
    if member.isdir():
        os.makedirs(target, exist_ok=True)
        return
    # An archive may list a file without its folders (tar does not require them).
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.lexists(target) and not os.path.isdir(target):
        os.unlink(target)
    if member.issym():
        os.symlink(member.linkname, target)
        if not _inside(os.path.realpath(target), root):
            os.unlink(target)
            raise IngestError(f"symlink {member.name!r} resolves outside the run directory")
        return
    src = tar.extractfile(member)
    assert src is not None  # regular files always have a payload
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(src, out)
    os.chmod(target, member.mode & 0o755)


def fetch_snapshot(client: Client, sha: str, dest: str, scratch: str | None = None) -> None:
    """Download the job's snapshot (retrying transient failures) and unpack it into dest.

    The archive waits in `scratch` (the attempt dir), never in the job's TMPDIR."""
    with tempfile.TemporaryDirectory(prefix="sf-ingest-", dir=scratch) as tmp:
        archive = os.path.join(tmp, "snapshot.tar.gz")
        _download(client, archive)
        if _sha256(archive) != sha:
            raise IngestError(f"snapshot checksum mismatch (expected {sha})")
        safe_unpack(archive, dest)


def _download(client: Client, archive: str) -> None:
    for attempt in range(FETCH_TRIES):
        try:
            with open(archive, "wb") as fh:
                client.download("/api/v1/ingest/snapshot", fh)
            return
        except ApiError as exc:
            if not _retryable(exc) or attempt == FETCH_TRIES - 1:
                raise IngestError(f"snapshot download: HTTP {exc.status}: {exc.detail}") from exc
            time.sleep(_retry_delay(exc, 2**attempt))
        except ConnectError as exc:
            if attempt == FETCH_TRIES - 1:
                raise IngestError(f"snapshot download: {exc}") from exc
            time.sleep(2**attempt)


def exchange_bootstrap(api_url: str, bootstrap: str, attempt: int, rank: int | None = None) -> str:
    """Spend the one-time bootstrap credential (Ray, Kubernetes) for the attempt's job token;
    a runner of one rank of a multi-node job (a Kubernetes pod) spends it for its rank."""
    client = Client(api_url, bootstrap)
    body = {"attempt": attempt} if rank is None else {"attempt": attempt, "rank": rank}
    for tries in range(FETCH_TRIES):
        last = tries == FETCH_TRIES - 1
        try:
            answer = client.request("POST", "/api/v1/ingest/token", json_body=body)
        except ApiError as exc:
            if not _retryable(exc) or last:
                raise IngestError(f"token exchange: HTTP {exc.status}: {exc.detail}") from exc
            time.sleep(_retry_delay(exc, 2**tries))
            continue
        except ConnectError as exc:
            if last:
                raise IngestError(f"token exchange: {exc}") from exc
            time.sleep(2**tries)
            continue
        token = answer.get("token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise IngestError("token exchange: the server's answer holds no token")
        return token
    raise IngestError("token exchange: no answer")  # not reached: the last try raises


def _sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_entrypoint(argv: list[str], run_dir: str, path: str | None = None) -> list[str]:
    """Check the entrypoint executable exists before spawning (a missing one is ingest)."""
    exe = argv[0]
    if "/" in exe:
        path = os.path.join(run_dir, exe)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise IngestError(f"entrypoint {exe!r} is not an executable file in the snapshot")
        return argv
    if shutil.which(exe, path=path) is None:
        raise IngestError(f"entrypoint executable {exe!r} not found on PATH")
    return argv


# --- shipping logs and metrics ---------------------------------------------------------


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
        _say(f"gave up shipping {lost} {self.what} after {FLUSH_GIVE_UP_S:.0f}s of failures")
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
        if _retryable(exc):
            self.retry_after = _retry_delay(exc, 0.0)
            return False
        if exc.status == 413:
            if len(batch) > 1:
                self.limit = max(1, len(batch) // 2)  # resend in smaller batches at once
                return True
            self._drop_below(batch[0]["seq"] + 1)  # one record larger than any batch allowed
            _say(f"dropped one of the {self.what} (seq {batch[0]['seq']}): {exc.detail}")
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
        _say(message)


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
            _say(f"skipped {self.skipped} lines of {self.path} that were not metric points")

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
        kind in ("train", "validation")
        and isinstance(name, str)
        and 0 < len(name) <= 100
        and type(step) is int
        and step >= 0
        and type(value) in (int, float)
        and math.isfinite(value)
        and type(ts) in (int, float)
        and math.isfinite(ts)
    ):
        return None
    return {"kind": kind, "name": name, "step": step, "value": value, "ts": ts}


# --- process supervision -------------------------------------------------------------


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


def _pump(pipe: IO[bytes], stream: str, sink: LineSink, rank: int | None = None) -> None:
    with pipe:
        while raw := pipe.readline(READ_CHUNK):
            text = raw.decode("utf-8", errors="replace")
            sink.emit(stream, text.removesuffix("\n"), rank)


# --- the job's identity and environment ------------------------------------------------


class JobIdentity:
    """The uid the job runs as when the runner is root (SF_RUN_AS_UID/GID/USER)."""

    def __init__(self, uid: int, gid: int, user: str) -> None:
        self.uid, self.gid, self.user = uid, gid, user

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> JobIdentity | None:
        uid, gid = environ.get("SF_RUN_AS_UID", ""), environ.get("SF_RUN_AS_GID", "")
        if not uid:
            return None
        if not (uid.isdigit() and gid.isdigit()) or int(uid) == 0:
            raise IngestError(f"SF_RUN_AS_UID/GID must be a non-root uid and a gid: {uid}/{gid}")
        if os.geteuid() != 0:
            raise IngestError("SF_RUN_AS_UID is set but the runner is not root")
        return cls(int(uid), int(gid), environ.get("SF_RUN_AS_USER") or f"uid{uid}")

    def popen_args(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": 0o077}

    def own_dir(self, path: str) -> None:
        """Create `path` (its parent must exist) as the job's, mode 0700, never following a
        link the job may have left there on an earlier attempt."""
        os.makedirs(path, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, self.uid, self.gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)

    def own_tree(self, root: str) -> None:
        """Give the unpacked snapshot to the job; `root` last, so it cannot enter before."""
        for folder, dirs, files in os.walk(root, topdown=False):
            for name in dirs + files:
                os.lchown(os.path.join(folder, name), self.uid, self.gid)
        self.own_dir(root)


class RunnerEnv:
    """The SF_* environment contract between executors and the runner."""

    def __init__(self, environ: dict[str, str]) -> None:
        self.environ = environ
        self.api_url = environ.get("SF_API_URL", "")
        self.token = environ.get(JOB_TOKEN_VAR, "")
        self.bootstrap = environ.get(BOOTSTRAP_TOKEN_VAR, "")
        self.record_key = environ.get(RECORD_KEY_VAR, "")
        attempt = environ.get("SF_ATTEMPT", "")
        self.attempt = int(attempt) if attempt.isdigit() else 1
        self.run_dir = os.path.abspath(environ.get(RUN_DIR_VAR) or RUN_DIR)
        self.output_dir = environ.get("SF_OUTPUT_DIR", "")
        self.checkpoint_dir = environ.get("SF_CHECKPOINT_DIR", "")
        self.entrypoint_raw = environ.get("SF_ENTRYPOINT", "")
        self.snapshot = environ.get("SF_SNAPSHOT", "")
        self.exit_file = os.path.abspath(environ.get(EXIT_FILE_VAR) or EXIT_FILE)
        self.started_file = os.path.abspath(environ.get(STARTED_FILE_VAR) or STARTED_FILE)
        self.attempt_dir = os.path.dirname(self.exit_file)
        # A job of another uid cannot write the attempt dir: its metrics go to a folder of its
        # own (SF_METRICS_FILE tells the SDK where, either way).
        metrics_dir = self.attempt_dir
        if environ.get("SF_RUN_AS_UID"):
            metrics_dir = os.path.join(self.attempt_dir, "metrics")
        self.metrics_file = os.path.join(metrics_dir, METRICS_FILE)
        self.notice_file = os.path.join(metrics_dir, NOTICE_FILE)
        self.stop_grace = _seconds(environ.get(STOP_GRACE_VAR), DEFAULT_STOP_GRACE_S)
        self.preempt_grace = _seconds(environ.get(PREEMPT_GRACE_VAR), DEFAULT_PREEMPT_GRACE_S)
        self.identity: JobIdentity | None = None

    def client(self) -> Client | None:
        return Client(self.api_url, self.token) if self.api_url else None

    @property
    def own_rank(self) -> int | None:
        """This runner's rank where each rank of a multi-node job has a runner of its own
        (a Kubernetes pod: the engine put SF_NODE_RANK in the runner's environment); None
        where one runner starts every rank, or the job has one."""
        raw = self.environ.get(NODE_RANK_VAR, "")
        return int(raw) if raw.isdigit() else None

    def shipping_client(self) -> Client | None:
        """Where logs, metrics and the start report go. Only rank 0's runner sends them when
        each rank has its own: one attempt has one line numbering, and the engine tells when
        the last rank is up. The other ranks' output stays in their own console.log."""
        rank = self.own_rank
        return self.client() if rank is None or rank == 0 else None

    def entrypoint(self) -> list[str]:
        try:
            argv = json.loads(self.entrypoint_raw)
        except ValueError as exc:
            raise IngestError(f"SF_ENTRYPOINT is not valid JSON: {exc}") from exc
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise IngestError("SF_ENTRYPOINT must be a non-empty JSON list of strings")
        return argv

    def job_dirs(self) -> list[str]:
        """The folders the job writes: TMPDIR only where the executor put it in the attempt."""
        tmpdir = self.environ.get("TMPDIR", "")
        dirs = [os.path.dirname(self.metrics_file), self.output_dir, self.checkpoint_dir]
        if tmpdir and os.path.dirname(os.path.abspath(tmpdir)) == self.attempt_dir:
            dirs.append(tmpdir)
        return [d for d in dirs if d]

    def sandbox_dirs(self) -> list[str]:
        """What the job reaches in its sandbox whatever the masks hide: its run dir, the
        folders it writes, and a follow-on's parent outputs (its team's too)."""
        parent = self.environ.get("SF_PARENT_OUTPUT_DIR", "")
        extra = [parent] if parent and os.path.isdir(parent) else []
        return [self.run_dir, *self.job_dirs(), *extra]


def prepare(env: RunnerEnv) -> tuple[list[str], dict[str, str]]:
    """Create the directories, ingest the snapshot; return the checked argv and job env."""
    try:
        env.identity = JobIdentity.from_environ(env.environ)
        os.makedirs(env.run_dir, exist_ok=True)
        for path in env.job_dirs():
            if env.identity:
                env.identity.own_dir(path)
            else:
                os.makedirs(path, exist_ok=True)
        # Without an API the runner runs offline (nothing to ship, nothing to exchange for).
        if env.bootstrap and not env.token and env.api_url:
            env.token = exchange_bootstrap(env.api_url, env.bootstrap, env.attempt, env.own_rank)
        client = env.client()
        if env.snapshot:
            if client is None:
                raise IngestError("SF_SNAPSHOT is set but SF_API_URL is empty")
            fetch_snapshot(client, env.snapshot, env.run_dir, env.attempt_dir)
        if env.identity:
            env.identity.own_tree(env.run_dir)
        child = child_env(env)
        return resolve_entrypoint(env.entrypoint(), env.run_dir, child.get("PATH")), child
    except (OSError, ValueError) as exc:
        raise IngestError(str(exc)) from exc


def child_env(env: RunnerEnv) -> dict[str, str]:
    """The job's environment: never the runner's credentials, files or identity settings.

    With SF_USER_ENV (the local executor) it is the minimal base, the job's own variables and
    the contract a job may see; otherwise (the runner's environment holds the job's variables)
    the runner's environment without what only the runner may see."""
    environ = env.environ
    raw = environ.get("SF_USER_ENV")
    if raw is None:
        out = {k: v for k, v in environ.items() if k not in RUNNER_ONLY}
    else:
        out = {k: environ[k] for k in BASE_NAMES if k in environ}
        out.update(_user_env(raw))
        out.update(
            {k: v for k, v in environ.items() if k in CHILD_CONTRACT or k.startswith("SF_PARENT_")}
        )
        if "CUDA_VISIBLE_DEVICES" in environ:
            out["CUDA_VISIBLE_DEVICES"] = environ["CUDA_VISIBLE_DEVICES"]
        # A rank with a runner of its own (a Kubernetes pod) got its contract from the engine.
        out.update({k: v for k, v in environ.items() if k in RANK_VARS})
    out["PYTHONPATH"] = os.pathsep.join(p for p in (env.run_dir, out.get("PYTHONPATH")) if p)
    out["PYTHONUNBUFFERED"] = "1"
    out["SF_METRICS_FILE"] = env.metrics_file
    out[NOTICE_FILE_VAR] = env.notice_file
    out[PREEMPT_GRACE_VAR] = str(int(env.preempt_grace))
    return out


def _seconds(raw: str | None, default: float) -> float:
    """A grace in whole seconds from the executor's environment, else `default`."""
    return float(raw) if raw and raw.isdigit() else default


def _user_env(raw: str) -> dict[str, str]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise IngestError(f"SF_USER_ENV is not valid JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise IngestError("SF_USER_ENV must be a JSON object of strings")
    return {k: v for k, v in value.items() if k not in RUNNER_ONLY}


def run(env: RunnerEnv, plans: list[RankPlan]) -> int:
    """Run the ranks, in the executor's sandbox where it asked for one (`sf.sandbox`), and
    write the exit file; the sandbox is gone before the runner exits."""
    sandbox = None
    try:
        config = SandboxConfig.from_environ(env.environ)
        if config is not None:
            sandbox = Sandbox.open(config, env.sandbox_dirs(), env.attempt_dir)
        return run_ranks(env, plans, sandbox)
    except SandboxError as exc:
        return _ingest_failed(env, f"cannot make the job's sandbox: {exc}")
    except Terminated as exc:
        _say(f"stopped by signal {exc.signum} before the entrypoint started")
        return _finish(env, -exc.signum, None)
    finally:
        if sandbox is not None:
            sandbox.close()


def start_rank(env: RunnerEnv, plan: RankPlan, sandbox: Sandbox | None) -> subprocess.Popen:
    """One rank in its own session, as the job's uid: entered into the sandbox by `nsenter`
    (which stays root until it is inside, then takes the uid), or started here directly."""
    argv, identity = plan.argv, env.identity
    drop: dict[str, Any] = identity.popen_args() if identity else {}
    if sandbox is not None:
        uid, gid = (identity.uid, identity.gid) if identity else (None, None)
        argv = sandbox.enter(argv, env.run_dir, uid, gid)
        drop = {"umask": 0o077} if identity else {}
    proc = subprocess.Popen(
        argv,
        cwd=env.run_dir,
        env=plan.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **drop,
    )
    if sandbox is not None:
        sandbox.adopt(proc.pid)
    return proc


def run_ranks(env: RunnerEnv, plans: list[RankPlan], sandbox: Sandbox | None) -> int:
    """Start every rank, stream their output and metrics, end all when one fails, and write
    the exit file. A single-node job is one rank: the job itself, as it always ran."""
    client = env.shipping_client()
    shipper = LogShipper(client, env.attempt)
    owner = env.identity.uid if env.identity else None
    metrics = MetricsTail(env.metrics_file, MetricsShipper(client, env.attempt), owner)
    console_path = os.path.join(env.attempt_dir, CONSOLE_LOG)
    multi = len(plans) > 1
    spared = sandbox.helpers if sandbox is not None else None
    with open(console_path, "a", encoding="utf-8") as console:
        procs: list[subprocess.Popen] = []
        for plan in plans:
            try:
                procs.append(start_rank(env, plan, sandbox))
            except OSError as exc:
                Supervisor(procs, spared=spared).end_all()
                for proc in procs:
                    proc.wait()
                return _ingest_failed(env, f"cannot start entrypoint {plan.argv[0]!r}: {exc}")
        supervisor = Supervisor(
            procs,
            terminator(env.environ, plans),
            stop_grace=env.stop_grace,
            preempt_grace=env.preempt_grace,
            notice=lambda kind, kill_at: write_notice(env.notice_file, kind, kill_at),
            spared=spared,
        )
        supervisor.install()
        checkpoints = CheckpointWatcher(client, env.attempt, env.checkpoint_dir)
        started_at = time.time()
        started: dict[str, Any] = {"started_at": started_at, "pid": procs[0].pid}
        if multi:
            started["pids"] = [proc.pid for proc in procs]
            started["ranks"] = [
                {"rank": p.index, "node": p.node, "state": "running", "exit_code": None}
                for p in plans
            ]
        write_record(env.started_file, started, env.record_key)
        report_started(client, env.attempt)
        shipper.start()
        metrics.shipper.start()
        metrics.start()
        checkpoints.start()
        # start_new_session=True: each rank's pid is its process group's id. An srun step's
        # processes run under slurmstepd, not here: nothing of theirs to sample on this host.
        samplers = [
            SystemSampler(
                proc.pid,
                metrics.add,
                sample_interval(plan.env),
                plan.env.get("CUDA_VISIBLE_DEVICES"),
                prefix=f"rank{plan.index}/" if multi else "",
            )
            for plan, proc in zip(plans, procs, strict=True)
            if plan.argv[:1] != ["srun"]
        ]
        for sampler in samplers:
            sampler.start()
        own = env.own_rank  # a pod of a multi-node job: its lines are its rank's
        sink = LineSink(console, shipper, ranked=multi or own is not None, marked=multi)
        readers = []
        for plan, proc in zip(plans, procs, strict=True):
            rank = plan.index if multi else own
            for pipe, stream in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
                reader = threading.Thread(
                    target=_pump, args=(pipe, stream, sink, rank), daemon=True
                )
                reader.start()
                readers.append(reader)
        codes, failed = wait_ranks(procs, supervisor)
        for sampler in samplers:
            sampler.stop()  # no samples of a finished job; before the final flush and exit file
        supervisor.end_leftovers(readers)
    if sandbox is not None:
        sandbox.close()  # nothing of the job is left in it: the exit record says so
    metrics.stop()
    checkpoints.stop()  # the checkpoint a preempted job saved on its notice, reported now
    # Both channels flush at once: a down server costs the give-up time once, not twice.
    for channel in (shipper, metrics.shipper):
        channel.begin_close()
    for channel in (shipper, metrics.shipper):
        channel.join()
    if not multi:
        return _finish(env, codes[0], started_at)
    return _finish_ranks(env, plans, codes, failed, supervisor.signalled, started_at)


# How often the runner looks at its ranks, and so the longest a stop or a preemption notice
# waits for its handler: Python runs signal handlers in the main thread, and a signal the
# kernel hands to another of the runner's threads (the readers, samplers, shippers) does not
# interrupt a main thread blocked in waitpid. Waiting without a timeout would act on that
# notice only once the job exited by itself.
RANK_POLL_S = 0.05


def wait_ranks(
    procs: list[subprocess.Popen], supervisor: Supervisor
) -> tuple[list[int], int | None]:
    """Wait for every rank; the first to exit non-zero fails the attempt and every other rank
    is ended at once (SIGTERM, SIGKILL after the grace). Returns the exit codes and the index
    of the rank that failed first (None: none failed). A single-node job is one rank, the job
    itself: what it leaves running is ended once it exits (`Supervisor.end_leftovers`)."""
    codes: list[int | None] = [None] * len(procs)
    failed = None
    while True:
        for index, proc in enumerate(procs):
            if codes[index] is None:
                code = proc.poll()
                if code is None:
                    continue
                codes[index] = code
                if code != 0 and failed is None:
                    failed = index
                    if len(procs) > 1:
                        supervisor.end_all()
        if all(code is not None for code in codes):
            return [c if c is not None else 0 for c in codes], failed
        time.sleep(RANK_POLL_S)


def _finish_ranks(
    env: RunnerEnv,
    plans: list[RankPlan],
    codes: list[int],
    failed: int | None,
    stopped: bool,
    started_at: float,
) -> int:
    states = rank_states(list(codes), failed, stopped)
    ranks = [
        {"rank": p.index, "node": p.node, "state": state, "exit_code": code}
        for p, code, state in zip(plans, codes, states, strict=True)
    ]
    code, reason = 0, ""
    if failed is not None:
        code = codes[failed]
        plan = plans[failed]
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        reason = f"rank {plan.index} on {plan.node} {how}"
        if not stopped:
            reason += "; every other rank was ended"
    record = {
        "exit_code": code,
        "reason": reason,
        "started_at": started_at,
        "ranks": ranks,
        "failed_rank": None if stopped else failed,
    }
    write_record(env.exit_file, {**record, "ended_at": time.time()}, env.record_key)
    return exit_status(code)


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
                if not _retryable(exc):
                    return  # refused (attempt over, token wrong): nothing to retry
                delay = _retry_delay(exc, backoff)

    threading.Thread(target=send, name="sf-started", daemon=True).start()


def _finish(env: RunnerEnv, code: int, started_at: float | None) -> int:
    reason = f"killed by signal {-code}" if code < 0 else ""
    record = {"exit_code": code, "reason": reason, "started_at": started_at}
    write_record(env.exit_file, {**record, "ended_at": time.time()}, env.record_key)
    return exit_status(code)


def _ingest_failed(env: RunnerEnv, why: str) -> int:
    reason = f"{INGEST_FAILED}: {why}"
    _say(reason)
    record = {"exit_code": None, "reason": reason, "started_at": None}
    write_record(env.exit_file, {**record, "ended_at": time.time()}, env.record_key)
    return INGEST_EXIT


def record_process(path: str) -> None:
    """Write this runner's pid where the executor asked for it.

    The local executor also writes it after spawning us; writing it here first closes the gap
    in which a worker crash would leave a live runner that nobody could signal.
    """
    write_json_atomic(path, {"pid": os.getpid()})


def take_back_priority(raw: str | None) -> None:
    """Run at the niceness the executor names (NICENESS_VAR) if it is higher than this
    process's: a worker that lowered its own priority to leave the CPU to web requests must not
    pass that on to the job. Raising priority needs root or CAP_SYS_NICE; without them the job
    runs at the worker's, which the runner's log says."""
    if not raw:
        return
    try:
        wanted = int(raw)
    except ValueError:
        _say(f"ignoring {NICENESS_VAR}={raw!r}: not an integer")
        return
    now = os.getpriority(os.PRIO_PROCESS, 0)
    if wanted >= now:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, wanted)
    except PermissionError:
        _say(f"the job runs at niceness {now}: raising it to {wanted} needs CAP_SYS_NICE")


def main() -> int:
    """Run one attempt of a job as described by the SF_* environment."""
    # First of all: a job of our uid may not read our environ (credentials) or ptrace us, and
    # whatever it forks stays below us, however it detaches.
    guard_runner()
    take_back_priority(os.environ.get(NICENESS_VAR))
    if os.environ.get("SF_RUN_AS_UID"):
        os.umask(0o077)  # a root runner's files (console.log, records) are its own
    if os.environ.get(PROC_FILE_VAR):
        record_process(os.environ[PROC_FILE_VAR])
    env = RunnerEnv(dict(os.environ))
    # Until the child exists there is nothing to forward to: a stop must still leave an exit file.
    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGINT, _raise_terminated)
    signal.signal(signal.SIGUSR1, _raise_terminated)  # a preemption notice: nothing to save
    try:
        argv, child = prepare(env)
        plans = plan_ranks(env.environ, argv, child, env.run_dir)
    except (IngestError, RankPlanError) as exc:
        return _ingest_failed(env, str(exc))
    except Terminated as exc:
        _say(f"stopped by signal {exc.signum} before the entrypoint started")
        return _finish(env, -exc.signum, None)
    return run(env, plans)


if __name__ == "__main__":
    sys.exit(main())
