"""The rank-filtered reads of tests/jobs/test_multinode_reads.py with logs in object storage."""

import pytest

from tests.jobs.test_multinode_reads import *  # noqa: F403


@pytest.fixture(autouse=True)
def _logs_on_s3(on_s3):
    return on_s3
