"""Append-only log storage: one file per attempt, one JSON object per line.

A `LogStream` row per attempt holds the next expected sequence number and the committed file
size. Appends lock that row, drop lines the server already has (same attempt and seq), write,
and advance both in one transaction; readers never read past the committed size, and a writer
first truncates anything a failed transaction left behind. Lines are stored in their wire form,
so a replay splices stored bytes into the response without decoding them.

An attempt's log holds at most SF_ATTEMPT_MAX_LOG_BYTES stored bytes: the lines of a batch
that would pass it, and every later line, are dropped (their seqs still advance `next_seq`,
so the runner carries on instead of resending them). The first drop writes one note line in
their place (stderr, the first dropped line's seq) and one NOTE event; nothing stored before
is touched. The check costs nothing below the cap: it reads the row the append locks anyway.

Cursors are ``"<attempt>:<byte offset>"``. Each stored batch is also pushed, after commit, to
the job's page group (`jobs.broadcast`) with the cursor just after it.

Reads of one rank of a multi-node job (`rank`) pick that rank's stored lines by their bytes
(`"rank":N,` right after seq), without decoding them, and keep the lines that carry no rank
(the store's own notes, which concern every rank); the cursor of such a read still points just
after the last line scanned, so paging and following work as for the whole log.

Where the bytes live follows SF_STORAGE_URL (`jobs.stores.objects`). In a local directory an
attempt's log is one file, appended to under the row lock. Object storage cannot append, so
there each committed batch is a `LogChunk` row holding its bytes in the ledger, inserted in
the append's own transaction (nothing outside the ledger is called under the row lock, and a
failed transaction leaves nothing behind). A chunk keeps its bytes zlib-compressed (level 1:
log lines shrink about ninefold, and half a megabyte sent hex-escaped in the INSERT and then
TOASTed costs several times the compression); offsets, objects and reads are those of the
uncompressed log. Compaction moves chunks into objects keyed by the byte range they hold,
``<job>/<attempt>/<start>-<end>``: a run of pending batches once SF_LOG_SEGMENT_BYTES are
pending (a Celery task asked for after the commit), and the whole log into one object once
the attempt's ingest has closed (`compact_ended`, from beat), which then deletes, once, any
other object a crashed compaction left under the attempt's prefix. Byte offsets
never change, so cursors stay valid; the bytes are immutable, so a reader that finds a chunk
moved under it looks the chunks up again at the same offset and neither loses nor repeats a
line.
"""

import datetime as dt
import json
import logging
import shutil
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q

from jobs import broadcast
from jobs.models import Attempt, JobEvent, LogChunk, LogStream
from jobs.stores import objects

log = logging.getLogger(__name__)

DEFAULT_ATTEMPT_MAX_LOG_BYTES = 1024 * 1024 * 1024

READ_BLOCK = 1024 * 1024


class LogGap(Exception):
    """A batch starts after the next expected sequence number: earlier lines are missing."""

    def __init__(self, next_seq: int, first: int) -> None:
        self.next_seq = next_seq
        super().__init__(
            f"this batch starts at seq {first} but the server expects {next_seq}; "
            "send the missing lines first"
        )


@dataclass(frozen=True)
class AppendResult:
    accepted: int
    duplicates: int
    next_seq: int
    dropped: int = 0  # fresh lines past the attempt's cap, not stored


@dataclass(frozen=True)
class Page:
    raw_lines: list[bytes]
    cursor: str
    at_end: bool  # nothing more is stored after `cursor` right now


def log_path(job_id: int, attempt: int) -> Path:
    return Path(settings.SF_LOG_DIR) / str(job_id % 1000) / str(job_id) / f"attempt-{attempt}.log"


def max_log_bytes() -> int:
    return getattr(settings, "SF_ATTEMPT_MAX_LOG_BYTES", DEFAULT_ATTEMPT_MAX_LOG_BYTES)


def append(job_id: int, attempt: int, lines: list[dict]) -> AppendResult:
    """Store `lines` (dicts with seq, stream, ts, text), ignoring those already stored and
    dropping those past the attempt's cap."""
    lines = sorted(lines, key=lambda line: line["seq"])
    with transaction.atomic():
        stream = _locked_stream(job_id, attempt)
        fresh = _fresh_lines(lines, stream.next_seq)
        if not fresh:
            return AppendResult(0, len(lines), stream.next_seq)
        cap = max_log_bytes()
        payload = b"" if stream.dropped_lines else _encode(attempt, fresh)
        kept, dropped = fresh, 0
        if stream.dropped_lines or stream.size + len(payload) > cap:
            kept, payload = _within(attempt, fresh, cap - stream.size, stream.dropped_lines)
            dropped = len(fresh) - len(kept)
            if not stream.dropped_lines:  # the first drop: one note line, one event
                note = _cap_note(fresh[len(kept)]["seq"], attempt, cap)
                kept = [*kept, note]
                payload += _encode(attempt, [note])
                _cap_event(job_id, attempt, note["text"], cap)
        if payload:
            stream.size = _store_payload(stream, payload)
        stream.next_seq = fresh[-1]["seq"] + 1
        stream.dropped_lines += dropped
        LogStream.objects.filter(pk=stream.pk).update(
            size=stream.size, next_seq=stream.next_seq, dropped_lines=stream.dropped_lines
        )
        if kept:
            broadcast.publish_lines(job_id, attempt, kept, f"{attempt}:{stream.size}")
    accepted = len(fresh) - dropped
    return AppendResult(accepted, len(lines) - len(fresh), stream.next_seq, dropped)


def _within(attempt: int, fresh: list[dict], room: int, capped: int) -> tuple[list[dict], bytes]:
    """The leading lines of `fresh` whose stored form fits in `room` bytes (none once capped)."""
    if capped:
        return [], b""
    kept: list[dict] = []
    parts: list[bytes] = []
    for line in fresh:
        encoded = _encode(attempt, [line])
        if len(encoded) > room:
            break
        room -= len(encoded)
        kept.append(line)
        parts.append(encoded)
    return kept, b"".join(parts)


def _cap_note(seq: int, attempt: int, cap: int) -> dict:
    text = (
        f"log limit of {cap / 2**20:g} MB reached for attempt {attempt}; further lines are dropped"
    )
    return {"seq": seq, "stream": "stderr", "ts": round(time.time(), 3), "text": text}


def _cap_event(job_id: int, attempt: int, text: str, cap: int) -> None:
    JobEvent.objects.create(
        job_id=job_id,
        kind=JobEvent.Kind.NOTE,
        actor="ingest",
        attempt=attempt,
        reason=text,
        data={"limit": "log_bytes", "max_bytes": cap},
    )


def _locked_stream(job_id: int, attempt: int) -> LogStream:
    """The attempt's stream row, locked; made by the first batch (one query after that)."""
    locked = LogStream.objects.select_for_update()
    stream = locked.filter(job_id=job_id, attempt=attempt).first()
    if stream is None:
        LogStream.objects.get_or_create(job_id=job_id, attempt=attempt)  # two first batches
        stream = locked.get(job_id=job_id, attempt=attempt)
    return stream


def _fresh_lines(lines: list[dict], next_seq: int) -> list[dict]:
    fresh = []
    expected = next_seq
    for line in lines:
        if line["seq"] < expected:
            continue  # already stored (a resend), or a repeat inside this batch
        if line["seq"] > expected:
            raise LogGap(expected, line["seq"])
        fresh.append(line)
        expected += 1
    return fresh


def _encode(attempt: int, lines: list[dict]) -> bytes:
    # What json.dumps(line, ensure_ascii=False, separators=(",", ":")) writes, a line at a
    # time without its per-call cost: seq is an int, stream one of two words, ts a finite int
    # or float (ingest checks all three; json writes numbers as their repr), and the text goes
    # through json's own string encoder.
    # A line of a multi-node job's rank carries it right after seq (ingest checked it is an
    # int below the attempt's nodes).
    text = json.encoder.encode_basestring  # type: ignore[attr-defined]
    return "".join(
        f'{{"attempt":{attempt},"seq":{ln["seq"]!r},'
        + (f'"rank":{ln["rank"]!r},' if "rank" in ln else "")
        + f'"stream":"{ln["stream"]}","ts":{ln["ts"]!r},"text":{text(ln["text"])}}}\n'
        for ln in lines
    ).encode(errors="replace")  # a lone surrogate in a line's text becomes "?"


def _store_payload(stream: LogStream, payload: bytes) -> int:
    """Keep the batch after the committed bytes; returns the new size."""
    if objects.is_local():
        return _write_payload(log_path(stream.job_id, stream.attempt), stream.size, payload)
    LogChunk.objects.create(
        stream=stream,
        start=stream.size,
        length=len(payload),
        data=zlib.compress(payload, LEDGER_ZLIB_LEVEL),
        zlib=True,
    )
    size = stream.size + len(payload)
    if size // settings.SF_LOG_SEGMENT_BYTES > stream.size // settings.SF_LOG_SEGMENT_BYTES:
        transaction.on_commit(partial(_ask_compaction, stream.pk))
    return size


def _write_payload(path: Path, committed: int, payload: bytes) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as handle:
        if handle.tell() != committed:
            handle.truncate(committed)  # bytes of a transaction that did not commit
        handle.write(payload)
    return committed + len(payload)


def _streams(job_id: int) -> list[tuple[int, int, int]]:
    """(attempt, committed size, stream pk) of each attempt that stored a line, in order."""
    return list(
        LogStream.objects.filter(job_id=job_id)
        .order_by("attempt")
        .values_list("attempt", "size", "pk")
    )


def _open(job_id: int, attempt: int, stream_id: int, size: int) -> IO[bytes]:
    """A reader of the attempt's first `size` bytes, wherever they are kept."""
    if objects.is_local():
        return open(log_path(job_id, attempt), "rb")
    return _ChunkReader(job_id, attempt, stream_id, size)  # type: ignore[return-value]


def read(job_id: int, cursor: str | None, limit: int, rank: int | None = None) -> Page:
    """Up to `limit` lines after `cursor` (from the very first line when it is None); with
    `rank`, only that rank's lines (and lines of no rank)."""
    streams = _streams(job_id)
    attempt, offset = parse_cursor(cursor) if cursor else (0, 0)
    _check_stored(cursor, attempt, offset, streams)
    out: list[bytes] = []
    for number, size, stream_id in streams:
        if number < attempt:
            continue
        start = offset if number == attempt else 0
        if start >= size:
            attempt, offset = number, size
            continue
        with _open(job_id, number, stream_id, size) as handle:
            _check_boundary(handle, start, cursor)
            lines, consumed = _read_lines(handle, size - start, limit - len(out), rank)
        out.extend(lines)
        attempt, offset = number, start + consumed
        if len(out) >= limit:
            break
    at_end = not streams or (attempt, offset) == streams[-1][:2]
    return Page(out, f"{attempt}:{offset}", at_end)


def _read_lines(
    handle, available: int, want: int, rank: int | None = None
) -> tuple[list[bytes], int]:
    """Up to `want` whole lines (of `rank`) from the handle's position, reading no more than
    it needs; also the bytes scanned, up to the end of the last line taken."""
    lines: list[bytes] = []
    consumed = 0
    pending = b""
    keep = _of_rank(rank)
    while len(lines) < want and available > 0:
        block = handle.read(min(READ_BLOCK, available))
        available -= len(block)
        *complete, pending = (pending + block).split(b"\n")
        if keep is None:
            taken = complete[: want - len(lines)]
            lines.extend(taken)
            consumed += sum(map(len, taken)) + len(taken)
            continue
        for line in complete:
            consumed += len(line) + 1
            if keep(line):
                lines.append(line)
                if len(lines) == want:
                    break
    return lines, consumed


# A stored line's rank is the only place its bytes can hold `,"rank":`: the text is JSON-encoded,
# so every quote in it is escaped.
RANKED = b',"rank":'
Keep = Callable[[bytes], bool]


def _of_rank(rank: int | None) -> Keep | None:
    """The test a stored line passes when it belongs in a read of `rank` (None: every line)."""
    if rank is None:
        return None
    marker = b',"rank":%d,' % rank
    return lambda line: marker in line or RANKED not in line


def _check_stored(
    cursor: str | None, attempt: int, offset: int, streams: list[tuple[int, int, int]]
) -> None:
    """A cursor names a stored position; one past the end would skip lines written later."""
    last_attempt = streams[-1][0] if streams else 0
    sizes = {number: size for number, size, _ in streams}
    if attempt <= last_attempt and offset <= sizes.get(attempt, 0):
        return
    raise ValueError(f"cursor {cursor!r} points past the end of the stored log")


def _check_boundary(handle, offset: int, cursor: str | None) -> None:
    if offset > 0:
        handle.seek(offset - 1)
        if handle.read(1) != b"\n":
            raise ValueError(f"cursor {cursor!r} does not point at the start of a line")
    handle.seek(offset)


def tail(job_id: int, n: int, rank: int | None = None) -> Page:
    """The last `n` lines over all attempts (of `rank`, and lines of no rank), and the cursor
    just after them."""
    streams = _streams(job_id)
    if not streams:
        return Page([], "0:0", True)
    kept: deque[bytes] = deque(maxlen=n)
    keep = _of_rank(rank)
    for number, size, stream_id in reversed(streams):
        if len(kept) >= n:
            break
        with _open(job_id, number, stream_id, size) as handle:
            found = _last_lines(handle, size, n - len(kept), keep)
        for line in reversed(found):
            kept.appendleft(line)
    last_attempt, last_size, _ = streams[-1]
    return Page(list(kept), f"{last_attempt}:{last_size}", True)


RANK_TAIL_SCAN = 2000  # lines read back to find one rank's last ones


def tail_text(job_id: int, attempt: int, n: int, rank: int | None = None) -> str:
    """The last `n` lines of one attempt (of one rank of it) as plain text, for failure
    reasons."""
    stream = LogStream.objects.filter(job_id=job_id, attempt=attempt).first()
    if stream is None:
        return ""
    scan = n if rank is None else max(n, RANK_TAIL_SCAN)
    with _open(job_id, attempt, stream.pk, stream.size) as handle:
        lines = [json.loads(raw) for raw in _last_lines(handle, stream.size, scan)]
    if rank is not None:
        lines = [line for line in lines if line.get("rank") == rank]
    return "\n".join(line["text"] for line in lines[-n:])


def _last_lines(handle, size: int, n: int, keep: Keep | None = None) -> list[bytes]:
    """The last `n` lines of the first `size` bytes (that pass `keep`), read backwards."""
    if n <= 0 or size == 0:
        return []
    block = 64 * 1024
    found: list[bytes] = []  # newest first
    end = size
    head = b""  # the start of a line whose beginning is not read yet
    while end > 0 and len(found) < n:
        start = max(0, end - block)
        handle.seek(start)
        lines = (handle.read(end - start) + head).split(b"\n")
        end = start
        head = lines.pop(0) if start > 0 else b""
        for line in reversed(lines):
            if line and (keep is None or keep(line)):
                found.append(line)
                if len(found) == n:
                    break
    return found[::-1]


def parse_cursor(cursor: str) -> tuple[int, int]:
    try:
        attempt, offset = (int(part) for part in cursor.split(":"))
    except ValueError:
        raise ValueError(f"cursor {cursor!r} is not of the form '<attempt>:<offset>'") from None
    if attempt < 0 or offset < 0:
        raise ValueError(f"cursor {cursor!r} has a negative part")
    return attempt, offset


def delete_logs(job_id: int) -> None:
    """Remove a deleted job's log files or objects (its LogStream rows went with the job row)."""
    if objects.is_local():
        shutil.rmtree(log_path(job_id, 0).parent, ignore_errors=True)
    else:
        objects.store("logs").delete_prefix(f"{job_id}/")


# -- object storage: chunks, their reader, compaction ----------------------------------------------

LEDGER_ZLIB_LEVEL = 1  # the fastest: most of the gain of any level, at a fifth of the cost of 6
OBJECT_BLOCK = 4 * 1024 * 1024  # bytes fetched per ranged GET of a compacted object
MAX_LOOKUPS = 5  # looks at the chunk rows per read block before calling the store broken
# Well after the ingest of an ended attempt closes (jobs.api.ingest.INGEST_GRACE_S): no batch
# can arrive once its log is compacted into one object (and one that did would only be
# compacted again).
COMPACT_AFTER_END_S = 300
COMPACT_TASK = "jobs.tasks.compact_log"
SWEEPS_PER_RUN = 200  # streams swept for orphaned objects per run: one LIST each


@dataclass(frozen=True)
class _Chunk:
    pk: int
    start: int
    end: int
    in_ledger: bool  # its bytes are in the row, not (yet) in the store


class _ChunkMoved(Exception):
    """A compaction committed since the chunk rows were read."""


def _chunk_key(job_id: int, attempt: int, start: int, end: int) -> str:
    return f"{job_id}/{attempt}/{start}-{end}"


def _chunks(stream_id: int) -> list[_Chunk]:
    in_ledger = ExpressionWrapper(Q(data__isnull=False), output_field=BooleanField())
    rows = (
        LogChunk.objects.filter(stream_id=stream_id)
        .order_by("start")
        .values_list("pk", "start", "length", in_ledger)
    )
    return [_Chunk(pk, start, start + length, held) for pk, start, length, held in rows]


class _ChunkReader:
    """A read-only file over bytes [0, size) of one attempt's log kept as chunks."""

    def __init__(self, job_id: int, attempt: int, stream_id: int, size: int) -> None:
        self.job_id, self.attempt, self.stream_id, self.size = job_id, attempt, stream_id, size
        self.pos = 0
        self._chunks: list[_Chunk] = []
        self._block: tuple[int, bytes] = (0, b"")  # (offset, bytes) last fetched

    def __enter__(self) -> "_ChunkReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._block = (0, b"")

    def seek(self, pos: int) -> None:
        self.pos = pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.size, self.pos + n)
        parts = []
        while self.pos < end:
            start, block = self._block_at(self.pos)
            part = block[self.pos - start : end - start]
            parts.append(part)
            self.pos += len(part)
        return b"".join(parts)

    def _block_at(self, pos: int) -> tuple[int, bytes]:
        start, block = self._block
        if start <= pos < start + len(block):
            return self._block
        for _ in range(MAX_LOOKUPS):
            chunk = self._chunk_at(pos)
            try:
                self._block = self._fetch(chunk, pos)
                return self._block
            except (_ChunkMoved, objects.ObjectMissing):
                self._chunks = []  # moved, never changed: look again at the same offset
        raise RuntimeError(
            f"the log of job {self.job_id} attempt {self.attempt} keeps moving at byte {pos}"
        )

    def _chunk_at(self, pos: int) -> _Chunk:
        for refreshed in (False, True):
            if refreshed or not self._chunks:
                self._chunks = _chunks(self.stream_id)
            for chunk in self._chunks:
                if chunk.start <= pos < chunk.end:
                    return chunk
        raise RuntimeError(
            f"the log of job {self.job_id} attempt {self.attempt} has no chunk at byte {pos}"
        )

    def _fetch(self, chunk: _Chunk, pos: int) -> tuple[int, bytes]:
        if chunk.in_ledger:
            row = LogChunk.objects.filter(pk=chunk.pk).values_list("data", "zlib").first()
            data, compressed = row or (None, False)
            if data is None:
                raise _ChunkMoved()
            return chunk.start, zlib.decompress(data) if compressed else bytes(data)
        start = chunk.start + (pos - chunk.start) // OBJECT_BLOCK * OBJECT_BLOCK
        end = min(chunk.end, start + OBJECT_BLOCK)
        key = _chunk_key(self.job_id, self.attempt, chunk.start, chunk.end)
        data = objects.store("logs").read_range(key, start - chunk.start, end - chunk.start)
        if len(data) != end - start:
            raise objects.ObjectMissing(key)  # a shorter object is not the one the row names
        return start, data


def _ask_compaction(stream_id: int) -> None:
    """Best effort: without a broker, the attempt's log stays in the ledger until it ends."""
    try:
        current_app.send_task(COMPACT_TASK, args=[stream_id], retry=False)
    except Exception as exc:
        log.warning("could not ask for the compaction of log stream %s (%s)", stream_id, exc)


def compact(stream_id: int, *, whole: bool = False) -> bool:
    """Move the stream's chunks held in the ledger into one object (with `whole`: every chunk,
    so the attempt's log is one object); returns whether anything moved.

    The object is written outside any transaction, then its chunks are swapped for one row in
    a transaction that deletes exactly the chunks read: a compaction that ran meanwhile makes
    that count differ, and this one rolls back. Objects it replaced go after the commit.
    """
    stream = LogStream.objects.filter(pk=stream_id).values_list("job_id", "attempt").first()
    chunks = _chunks(stream_id)
    run = chunks if whole else [chunk for chunk in chunks if chunk.in_ledger]
    if stream is None or not run or (len(run) == 1 and not run[0].in_ledger):
        return False
    job_id, attempt = stream
    start, end = run[0].start, run[-1].end
    key = _chunk_key(job_id, attempt, start, end)
    reader = _ChunkReader(job_id, attempt, stream_id, end)
    reader.seek(start)
    store = objects.store("logs")
    store.put_stream(key, reader)  # type: ignore[arg-type]
    replaced = [_chunk_key(job_id, attempt, c.start, c.end) for c in run if not c.in_ledger]
    try:
        with transaction.atomic():
            deleted, _ = LogChunk.objects.filter(pk__in=[c.pk for c in run]).delete()
            if deleted != len(run):
                raise _ChunkMoved()
            LogChunk.objects.create(stream_id=stream_id, start=start, length=end - start, data=None)
            transaction.on_commit(partial(_delete_objects, replaced))
    except _ChunkMoved:
        if not LogChunk.objects.filter(
            stream_id=stream_id, start=start, length=end - start, data__isnull=True
        ).exists():
            store.delete(key)
        return False
    return True


def _delete_objects(keys: list[str]) -> None:
    store = objects.store("logs")
    for key in keys:
        store.delete(key)


def compact_ended(now: dt.datetime) -> int:
    """Make the log of each attempt whose ingest closed one object, then delete the orphans
    under its prefix once; returns how many moved.

    Level-triggered: any stream of an ended attempt with a chunk in the ledger or more than
    one chunk; running it twice moves nothing the second time. One failing stream is logged
    and skipped.
    """
    if objects.is_local():
        return 0
    ended = Attempt.objects.filter(
        job_id=OuterRef("job_id"),
        number=OuterRef("attempt"),
        end_time__lt=now - dt.timedelta(seconds=COMPACT_AFTER_END_S),
    )
    scattered = LogChunk.objects.filter(stream=OuterRef("pk")).filter(
        Q(start__gt=0) | Q(data__isnull=False)
    )
    todo = LogStream.objects.filter(Exists(ended), Exists(scattered)).values_list("pk", flat=True)
    moved = 0
    for stream_id in todo:
        try:
            moved += compact(stream_id, whole=True)
        except Exception:
            log.exception("compacting log stream %s failed; the next sweep tries again", stream_id)
    compacted = LogStream.objects.filter(Exists(ended), ~Exists(scattered), objects_swept=False)
    for stream_id, job_id, attempt in compacted.values_list("pk", "job_id", "attempt")[
        :SWEEPS_PER_RUN
    ]:
        try:
            _sweep_orphans(stream_id, job_id, attempt)
        except Exception:
            log.exception("sweeping log stream %s failed; the next sweep tries again", stream_id)
    return moved


def _sweep_orphans(stream_id: int, job_id: int, attempt: int) -> None:
    """Delete every object under the compacted attempt's prefix but its one log object: what a
    compaction that crashed left (its object written but never recorded, or the objects it
    replaced, recorded but not yet deleted). Once per stream: no compaction can write there
    any more (the attempt's ingest closed, its log is one object, and a compaction of a log
    that is one object writes nothing)."""
    keep = {_chunk_key(job_id, attempt, c.start, c.end) for c in _chunks(stream_id)}
    store = objects.store("logs")
    for key in store.keys(f"{job_id}/{attempt}/"):
        if key not in keep:
            log.info("deleting orphaned log object %s", key)
            store.delete(key)
    LogStream.objects.filter(pk=stream_id).update(objects_swept=True)
