"""How metric points are stored: packed, one `MetricChunk` row per series and batch, its points
as four binary columns (`pack`), written with a binary COPY on PostgreSQL and one prepared
INSERT on SQLite. (A row per point cost PostgreSQL half of a batch's ingest: 2,000 rows and two
index entries each, where a packed batch of four series is four rows.)"""

import sys
from array import array
from collections.abc import Iterable, Sequence
from itertools import repeat

from django.db import connection, models
from django.db.models.functions import Length, Substr

from jobs.models import MetricChunk

CHUNK_COLUMNS = "job_id, attempt, kind, name, first_seq, last_seq, max_step, points"
# Their PostgreSQL types, for a binary COPY: no number goes through text on either side.
# The ingest's check made seq and step ints in bigint range, value and ts finite floats, kind
# and name strings that fit their varchar columns.
CHUNK_TYPES = ("int8", "int4", "text", "text", "int8", "int8", "int8", "bytea")
# A chunk's columns, in `pack` order: seq and step as int64, value and ts as float64.
PACKED = ("q", "q", "d", "d")
PACKED_BYTES = 8 * len(PACKED)  # per point
# A chunk's seqs: the first quarter of its points, read without the rest (PostgreSQL slices a
# value stored EXTERNAL, uncompressed, without reading it all).
SEQ_COLUMN = Substr("points", 1, Length("points") / len(PACKED), output_field=models.BinaryField())
# A chunk's row: kind, name, first_seq, last_seq, max_step and its packed points.
Chunk = tuple[str, str, int, int, int, bytes]


def chunk(
    kind: str,
    name: str,
    seqs: Sequence[int],
    steps: Sequence[int],
    values: Sequence[float],
    ts: Sequence[float],
) -> Chunk:
    """The chunk of one series' points, given in seq order as columns."""
    return kind, name, seqs[0], seqs[-1], max(steps), pack(seqs, steps, values, ts)


def write_chunks(job_id: int, attempt: int, chunks: Iterable[Chunk]) -> None:
    """Insert chunks of an attempt's points: a binary COPY on PostgreSQL, a prepared INSERT on
    SQLite. The caller has made sure none of their points is stored already."""
    table = MetricChunk._meta.db_table
    rows = [(job_id, attempt, *c) for c in chunks]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            binary = f"COPY {table} ({CHUNK_COLUMNS}) FROM STDIN (FORMAT BINARY)"
            with cursor.cursor.copy(binary) as copy:
                copy.set_types(CHUNK_TYPES)
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ", ".join(["%s"] * 8)
            cursor.executemany(f"INSERT INTO {table} ({CHUNK_COLUMNS}) VALUES ({marks})", rows)


def pack(
    seqs: Sequence[int], steps: Sequence[int], values: Sequence[float], ts: Sequence[float]
) -> bytes:
    """Points as one chunk's bytes: their seqs, steps, values and ts, each a column of
    little-endian 8-byte numbers (`PACKED`)."""
    columns = [
        array(code, column) for code, column in zip(PACKED, (seqs, steps, values, ts), strict=True)
    ]
    if sys.byteorder == "big":
        for column in columns:
            column.byteswap()
    return b"".join(column.tobytes() for column in columns)


def unpack_column(data: bytes | memoryview, code: str) -> array:
    """One packed column, as `pack` wrote it."""
    column = array(code)
    column.frombytes(data)
    if sys.byteorder == "big":
        column.byteswap()
    return column


def unpack(points: bytes | memoryview) -> tuple[array, array, array, array]:
    """A chunk's (seqs, steps, values, ts), as `pack` wrote them."""
    n = len(points) // PACKED_BYTES
    view = memoryview(points)
    seqs, steps, values, ts = (
        unpack_column(view[i * 8 * n : (i + 1) * 8 * n], code) for i, code in enumerate(PACKED)
    )
    return seqs, steps, values, ts


def stored_points(job_id: int) -> list[tuple[int, int, str, str, int, float, float]]:
    """Every stored point of a job as (attempt, seq, kind, name, step, value, ts), in attempt and
    seq order: what the runner's batches added, once each."""
    out: list[tuple[int, int, str, str, int, float, float]] = []
    for attempt, kind, name, points in MetricChunk.objects.filter(job_id=job_id).values_list(
        "attempt", "kind", "name", "points"
    ):
        seqs, steps, values, ts = unpack(points)
        out.extend(zip(repeat(attempt), seqs, repeat(kind), repeat(name), steps, values, ts))
    out.sort(key=lambda point: point[:2])
    return out
