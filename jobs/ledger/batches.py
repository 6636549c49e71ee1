"""How many jobs a loop writes in one transaction.

On the embedded ledger (SQLite) a write transaction holds the database's one write lock, which
every submit waits for (`starforge.db.sqlite3`). A scheduler tick admitting 60 jobs in one
transaction held it 14-22 ms on an idle machine, and 40-200 ms while the web workers kept both
cores busy: the holder gets a share of a core and is descheduled with the lock held. Every web
thread that reached a submit meanwhile waited, until both threads of each web worker did and the
workers answered nothing at all; those stalls were the API mix's p99 (`bench/http_bench.py`).
So there the loops write at most WRITE_BATCH jobs per transaction, and submits get the lock
between two batches. Each job's own rows (its status, its event, its attempt) still change in
one transaction, and each batch checks the ledger as it finds it then (the `expected` statuses
of `apply_transitions`), as one transaction for them all would.

On PostgreSQL writers of different rows do not wait for each other: one transaction, as before.
"""

from collections.abc import Iterator
from typing import TypeVar

from django.db import connection

T = TypeVar("T")
WRITE_BATCH = 10


def write_batches(items: list[T]) -> Iterator[list[T]]:
    """`items` in the slices a loop writes one transaction each: WRITE_BATCH at a time on the
    embedded ledger, all at once on PostgreSQL; nothing for no items."""
    size = WRITE_BATCH if connection.vendor == "sqlite" else max(1, len(items))
    for start in range(0, len(items), size):
        yield items[start : start + size]
