"""The storage tests on the real S3 server of `tests.s3` (the `s3_server` fixture).

`on_s3` points the snapshot and log stores at it for one test, under a
prefix of that test's own, so tests never see each other's objects.
"""

import uuid

import pytest

from jobs.stores import objects
from tests.s3 import BUCKET, s3_url


@pytest.fixture
def on_s3(settings, s3_server):
    """Snapshots and logs of this test in the S3 server, under a prefix of its own."""
    settings.SF_STORAGE = objects.parse_storage_url(s3_url(s3_server, f"t-{uuid.uuid4().hex}"))
    return settings.SF_STORAGE


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
