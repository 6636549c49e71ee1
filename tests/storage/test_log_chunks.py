"""Logs in object storage: batches as chunks in the ledger, compaction into objects, and reads
that stay the same before, during and after it (real commits, a real S3 server)."""

import datetime as dt
import json
import threading
import zlib

import pytest
from django.utils import timezone

from jobs.models import Attempt, LogChunk, LogStream
from jobs.stores import logstore, objects
from tests.api_helpers import submit
from tests.ingesting import attach_attempt, make_lines
from tests.threads import looping

pytestmark = [pytest.mark.s3, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def job_id(api, on_s3, settings) -> int:
    settings.SF_LOG_SEGMENT_BYTES = 10_000  # a segment every ~150 lines
    job_id = submit(api)
    attach_attempt(job_id, 1)
    return job_id


def texts(job_id: int, cursor=None, limit: int = 100_000) -> list[str]:
    return [json.loads(raw)["text"] for raw in logstore.read(job_id, cursor, limit).raw_lines]


def expected(start: int, stop: int, attempt: int = 1) -> list[str]:
    return [f"attempt {attempt} line {s}" for s in range(start, stop)]


def stream(job_id: int, attempt: int = 1) -> LogStream:
    return LogStream.objects.get(job_id=job_id, attempt=attempt)


def chunk_kinds(job_id: int) -> list[str]:
    rows = LogChunk.objects.filter(stream__job_id=job_id).order_by("stream__attempt", "start")
    return ["ledger" if row.data is not None else "object" for row in rows]


def append_batches(job_id: int, stop: int, batch: int = 50, attempt: int = 1) -> None:
    for first in range(0, stop, batch):
        logstore.append(job_id, attempt, make_lines(first, min(stop, first + batch), attempt))


def end_attempt(job_id: int, seconds_ago: float, attempt: int = 1) -> None:
    Attempt.objects.filter(job_id=job_id, number=attempt).update(
        end_time=timezone.now() - dt.timedelta(seconds=seconds_ago)
    )


def test_each_batch_is_a_chunk_in_the_ledger_and_no_object_until_compaction(job_id, bucket):
    append_batches(job_id, 100)
    assert chunk_kinds(job_id) == ["ledger", "ledger"]
    assert bucket() == {}
    assert texts(job_id) == expected(0, 100)


def test_a_chunk_keeps_its_batch_compressed_and_the_object_holds_the_log_bytes(job_id):
    append_batches(job_id, 50)
    (chunk,) = LogChunk.objects.filter(stream__job_id=job_id)
    original = zlib.decompress(chunk.data)
    assert chunk.zlib and len(chunk.data) < len(original) == chunk.length == stream(job_id).size
    assert original.startswith(b'{"attempt":1,"seq":0,') and original.endswith(b'line 49"}\n')
    logstore.compact(stream(job_id).pk, whole=True)
    key = f"{job_id}/1/0-{chunk.length}"
    assert objects.store("logs").read_range(key, 0, chunk.length) == original


def test_a_chunk_stored_uncompressed_before_0020_still_reads_and_compacts(job_id):
    append_batches(job_id, 100)
    first = LogChunk.objects.filter(stream__job_id=job_id).order_by("start").first()
    LogChunk.objects.filter(pk=first.pk).update(data=zlib.decompress(first.data), zlib=False)
    page = logstore.read(job_id, None, 60)
    assert texts(job_id) == expected(0, 100)
    logstore.compact(stream(job_id).pk, whole=True)
    assert chunk_kinds(job_id) == ["object"]
    assert texts(job_id, page.cursor) == expected(60, 100)


def test_pending_chunks_compact_into_one_object_keyed_by_their_byte_range(job_id, bucket):
    append_batches(job_id, 300)
    size = stream(job_id).size
    assert logstore.compact(stream(job_id).pk)
    assert chunk_kinds(job_id) == ["object"]
    assert bucket() == {f"logs/{job_id}/1/0-{size}": size}
    assert texts(job_id) == expected(0, 300)
    assert not logstore.compact(stream(job_id).pk)  # nothing pending: nothing moves


def test_cursors_and_tails_read_the_same_across_compaction(job_id):
    append_batches(job_id, 200)
    page = logstore.read(job_id, None, 120)
    tail_before = logstore.tail(job_id, 30)
    logstore.compact(stream(job_id).pk)
    append_batches_from(job_id, 200, 260)
    assert texts(job_id, page.cursor) == expected(120, 260)
    assert logstore.tail(job_id, 90).raw_lines[:30] == tail_before.raw_lines
    assert logstore.tail_text(job_id, 1, 2) == "attempt 1 line 258\nattempt 1 line 259"


def append_batches_from(job_id: int, start: int, stop: int) -> None:
    logstore.append(job_id, 1, make_lines(start, stop))


def test_an_ended_attempt_becomes_one_object_and_a_second_sweep_moves_nothing(job_id, bucket):
    append_batches(job_id, 200)
    logstore.compact(stream(job_id).pk)  # a segment object ...
    append_batches_from(job_id, 200, 230)  # ... then chunks in the ledger
    assert chunk_kinds(job_id) == ["object", "ledger"]
    end_attempt(job_id, seconds_ago=logstore.COMPACT_AFTER_END_S + 1)
    assert logstore.compact_ended(timezone.now()) == 1
    size = stream(job_id).size
    assert chunk_kinds(job_id) == ["object"]
    assert bucket() == {f"logs/{job_id}/1/0-{size}": size}  # the segment object went too
    assert texts(job_id) == expected(0, 230)
    assert logstore.compact_ended(timezone.now()) == 0


def test_objects_a_crashed_compaction_left_are_deleted_once_the_log_is_one_object(job_id, bucket):
    append_batches(job_id, 200)
    store = objects.store("logs")
    store.put_bytes(f"{job_id}/1/0-7777", b"written, then the worker died before the commit")
    logstore.compact(stream(job_id).pk)  # a segment object, replaced below
    segment = f"{job_id}/1/0-{stream(job_id).size}"
    append_batches_from(job_id, 200, 230)
    logstore.compact(stream(job_id).pk, whole=True)
    store.put_bytes(segment, b"replaced, then died before deleting it")
    store.put_bytes(f"{job_id}/10/0-5", b"another attempt's")  # not under attempt 1's prefix
    end_attempt(job_id, seconds_ago=logstore.COMPACT_AFTER_END_S - 10)
    logstore.compact_ended(timezone.now())
    assert len(bucket()) == 4  # its ingest may still be open: nothing is swept yet
    end_attempt(job_id, seconds_ago=logstore.COMPACT_AFTER_END_S + 1)
    assert logstore.compact_ended(timezone.now()) == 0  # one object already: nothing moves
    size = stream(job_id).size
    assert bucket() == {f"logs/{job_id}/1/0-{size}": size, f"logs/{job_id}/10/0-5": 17}
    assert stream(job_id).objects_swept
    assert texts(job_id) == expected(0, 230)


def test_an_attempt_whose_ingest_may_still_be_open_is_not_compacted(job_id):
    from jobs.api.ingest import INGEST_GRACE_S

    assert logstore.COMPACT_AFTER_END_S > INGEST_GRACE_S
    append_batches(job_id, 100)
    end_attempt(job_id, seconds_ago=INGEST_GRACE_S)
    assert logstore.compact_ended(timezone.now()) == 0
    assert chunk_kinds(job_id) == ["ledger", "ledger"]


def test_a_reader_racing_a_compaction_neither_loses_nor_repeats_a_line(job_id, monkeypatch):
    """The reader has read the chunk rows; the whole log moves into one object and the pieces
    are deleted before it fetches the next block."""
    append_batches(job_id, 300)
    logstore.compact(stream(job_id).pk)
    append_batches_from(job_id, 300, 400)
    end_attempt(job_id, seconds_ago=logstore.COMPACT_AFTER_END_S + 1)
    fetch = logstore._ChunkReader._fetch
    raced: list = []

    def fetch_after_a_compaction(self, chunk, pos):
        if not raced:
            raced.append("compacting")  # the compaction's own reads go straight through
            raced.append(logstore.compact_ended(timezone.now()))
        return fetch(self, chunk, pos)

    monkeypatch.setattr(logstore._ChunkReader, "_fetch", fetch_after_a_compaction)
    assert texts(job_id) == expected(0, 400)
    assert raced == ["compacting", 1]
    assert chunk_kinds(job_id) == ["object"]


def test_two_compactions_at_once_leave_one_object_and_the_same_log(job_id, bucket):
    append_batches(job_id, 400)
    errors: list = []
    barrier = threading.Barrier(2)

    def compact():
        try:
            barrier.wait()
            logstore.compact(stream(job_id).pk, whole=True)
        except Exception as exc:
            errors.append(exc)
        finally:
            from django.db import connections

            connections.close_all()

    threads = [threading.Thread(target=compact) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    size = stream(job_id).size
    assert chunk_kinds(job_id) == ["object"]
    assert bucket() == {f"logs/{job_id}/1/0-{size}": size}
    assert texts(job_id) == expected(0, 400)


def test_appends_reads_and_compactions_at_once_keep_every_line_once_in_order(job_id):
    """A runner ingests (and resends), a follower pages by cursor, a compactor segments."""
    total, stop, errors = 3000, threading.Event(), []
    sent = {"next": 0}
    followed: list[str] = []
    cursor = {"at": None}

    def ingest():
        first = sent["next"]
        if first >= total:
            stop.set()
            return
        batch = make_lines(max(0, first - 5), min(total, first + 70))  # 5 lines resent
        logstore.append(job_id, 1, batch)
        sent["next"] = batch[-1]["seq"] + 1

    def follow():
        page = logstore.read(job_id, cursor["at"], 500)
        followed.extend(json.loads(raw)["text"] for raw in page.raw_lines)
        cursor["at"] = page.cursor

    def compact():
        existing = LogStream.objects.filter(job_id=job_id).values_list("pk", flat=True).first()
        if existing is not None:
            logstore.compact(existing)

    workers = [looping(step, errors, stop) for step in (ingest, follow, compact)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert errors == []
    follow()  # whatever was stored after the follower's last page
    assert followed == expected(0, total)
    assert texts(job_id) == expected(0, total)
    assert stream(job_id).next_seq == total


def test_concurrent_resends_of_the_same_batch_store_it_once(job_id):
    errors: list = []
    barrier = threading.Barrier(4)

    def send():
        try:
            barrier.wait()
            logstore.append(job_id, 1, make_lines(0, 500))
        except Exception as exc:
            errors.append(exc)
        finally:
            from django.db import connections

            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert texts(job_id) == expected(0, 500)
    assert chunk_kinds(job_id) == ["ledger"]


def test_deleting_the_logs_removes_every_object_of_the_job(job_id, bucket, api):
    append_batches(job_id, 200)
    logstore.compact(stream(job_id).pk)
    other = submit(api)
    attach_attempt(other, 1)
    logstore.append(other, 1, make_lines(0, 200))
    logstore.compact(stream(other).pk)
    logstore.delete_logs(job_id)
    assert [key.split("/")[1] for key in bucket()] == [str(other)]
