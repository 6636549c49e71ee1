"""The storage tests on the real S3 server of `tests.s3`: what only object storage has (chunks
compacted into objects, the objects themselves), with the stores pointed at it by `on_s3`
(tests/conftest.py). The tests of the log and snapshot stores that hold on each store ask for
`storage` there instead."""

import pytest

from jobs.stores import objects
from tests.s3 import BUCKET


@pytest.fixture
def bucket(on_s3):
    """A raw boto3 view of this test's objects: {key below the prefix: size}."""
    client = objects._s3_client(on_s3)

    def listing() -> dict[str, int]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=on_s3.prefix)
        return {
            item["Key"].removeprefix(on_s3.prefix): item["Size"]
            for page in pages
            for item in page.get("Contents", [])
        }

    return listing
