"""GPU types on Ray: capacity names the accelerator types Ray reports for its nodes, and a job
asking for one is placed through that type's resource, in Ray's spelling."""

import pytest

from jobs.executors import Capacity, LaunchSpec
from jobs.executors.ray import RayExecutor
from jobs.models import Cluster

pytestmark = pytest.mark.ray


def executor() -> RayExecutor:
    return RayExecutor(Cluster(name="ray", kind="ray", settings={"address": "http://h:8265"}))


def spec(gpu_type: str = "") -> LaunchSpec:
    return LaunchSpec(
        name="sf-r-a1", job_id=1, run_id="r", attempt=1, total_gpus=1, entrypoint=["a"], env={},
        gpu_type=gpu_type,
    )  # fmt: skip


def test_capacity_names_the_accelerator_types_of_the_cluster_status(monkeypatch):
    ray = executor()
    usage = {"GPU": [1.0, 8.0], "accelerator_type:A100": [0.0, 1.0], "accelerator_type:T4": [0, 1]}
    report = {"data": {"clusterStatus": {"loadMetricsReport": {"usage": usage}}}}
    monkeypatch.setattr(ray, "_request", lambda method, path, body=None: (200, _json(report)))
    monkeypatch.setattr(ray, "_list_jobs", lambda: [])
    capacity = ray.capacity()
    assert (capacity.total_gpus, capacity.gpu_types) == (7, ["A100", "T4"])


def test_a_typed_job_asks_for_a_sliver_of_its_types_resource_in_rays_spelling(monkeypatch):
    ray = executor()
    monkeypatch.setattr(ray, "capacity", lambda: Capacity(True, 8, pool_gpu_types=("A100",)))
    body = ray._job_request(spec("a100"))
    assert body["entrypoint_resources"] == {"accelerator_type:A100": 0.001}
    assert "entrypoint_resources" not in ray._job_request(spec())


def _json(value) -> str:
    import json

    return json.dumps(value)
