"""The log cap tests of tests/hostile/test_ingest_caps.py with the log store in object storage."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.stores import logstore
from tests.hostile.test_ingest_caps import *  # noqa: F403
from tests.ingesting import make_lines, runner, send_lines

# A file append is no query; a chunk is one INSERT (its own test below).
del test_below_the_cap_a_batch_costs_no_more_queries  # noqa: F821


@pytest.fixture(autouse=True)
def _logs_on_s3(on_s3):
    return on_s3


def test_below_the_cap_a_batch_is_one_insert_more_than_on_disk(job_id):
    send_lines(runner(job_id), make_lines(0, 10))
    with CaptureQueriesContext(connection) as queries:
        logstore.append(job_id, 1, make_lines(10, 1010))
    sql = [q["sql"] for q in queries.captured_queries]
    read, chunk, write = [s for s in sql if not s.startswith(("SAVEPOINT", "RELEASE"))]
    assert read.startswith("SELECT") and '"jobs_logstream"' in read
    assert chunk.startswith('INSERT INTO "jobs_logchunk"')
    assert write.startswith('UPDATE "jobs_logstream"')
    if connection.features.has_select_for_update:  # SQLite locks the whole file instead
        assert "FOR UPDATE" in read
