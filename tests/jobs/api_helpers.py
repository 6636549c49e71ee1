"""Helpers shared by the API suites: submit, upload a snapshot, assert a clean refusal."""

import gzip
import io
import tarfile


def submit(client, **fields) -> int:
    response = client.post("/jobs", {"entrypoint": ["python", "train.py"], **fields})
    assert response.status_code == 201, response.content
    return response.json()["id"]


def upload_snapshot(api) -> str:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"pass\n"))
    response = api.client.post(
        "/api/v1/snapshots", gzip.compress(raw.getvalue()), content_type="application/gzip"
    )
    assert response.status_code == 201
    return response.json()["sha256"]


def assert_refused(response, status: int, *fragments: str) -> dict:
    """A 4xx with a JSON body whose `detail` is a sentence holding every fragment."""
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"]
    for fragment in fragments:
        assert fragment in body["detail"]
    return body
