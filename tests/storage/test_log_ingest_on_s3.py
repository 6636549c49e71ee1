"""The log ingest and read tests of tests/jobs/test_log_ingest.py, run with the log store in
object storage (tests/storage/conftest.py): dedupe, gaps, cursors, paging, tails."""

import pytest

from tests.jobs.test_log_ingest import *  # noqa: F403


@pytest.fixture(autouse=True)
def _logs_on_s3(on_s3):
    return on_s3
