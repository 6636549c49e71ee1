"""Helpers shared by the API suites: submit, upload a snapshot, assert a clean refusal."""

import gzip
import io
import tarfile


def submit(client, **fields) -> int:
    response = client.post("/jobs", {"entrypoint": ["python", "train.py"], **fields})
    assert response.status_code == 201, response.content
    return response.json()["id"]


def upload_snapshot(api) -> str:
    return upload_files(api, {"train.py": b"pass\n"})


def upload_files(api, files: dict[str, bytes]) -> str:
    """Upload a snapshot of `files` (name: content) for the API user's team; its sha256."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    response = api.client.post(
        "/api/v1/snapshots", gzip.compress(raw.getvalue()), content_type="application/gzip"
    )
    assert response.status_code == 201, response.content
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
