"""The snapshot ownership, deletion, pruning and quota tests of
tests/hostile/test_snapshot_ownership.py with the blobs in object storage."""

import pytest

from tests.hostile.test_snapshot_ownership import *  # noqa: F403


@pytest.fixture(autouse=True)
def _snapshots_on_s3(on_s3):
    return on_s3
