"""POST /api/v1/jobs for multi-node jobs: what a job needs per node, and every request that
could never run refused with a 4xx and a sentence, nothing created."""

import pytest

from jobs.executors import Capacity, NodeCapacity
from jobs.models import Cluster, Job, JobEvent
from tests.api_helpers import assert_refused

pytestmark = pytest.mark.django_db


class A100Nodes:
    """Two nodes with 4 a100 GPUs each and one with 2: 10 in all."""

    def __init__(self, cluster) -> None:
        pass

    def capacity(self) -> Capacity:
        sizes = {"n1": 4, "n2": 4, "n3": 2}
        return Capacity(
            reachable=True,
            total_gpus=10,
            nodes=tuple(NodeCapacity(n, g, "a100") for n, g in sizes.items()),
        )


@pytest.fixture(autouse=True)
def _two_nodes(use_executor, team):
    team.gpu_quota = 16
    team.save()
    use_executor(A100Nodes)


def nothing_created() -> bool:
    return not Job.objects.exists() and not JobEvent.objects.exists()


def test_a_gang_job_is_stored_with_nodes_times_gpus_and_what_each_node_needs(api):
    body = {
        "entrypoint": ["torchrun", "train.py"],
        "nodes": 2,
        "gpus": 4,
        "gpu_type": "a100",
        "cpus": 16,
        "memory": "64G",
    }
    response = api.post("/jobs", body)
    assert response.status_code == 201, response.content
    out = response.json()
    assert (out["nodes"], out["gpus_per_node"], out["gpus"]) == (2, 4, 8)
    assert (out["gpu_type"], out["cpus"], out["memory_mb"], out["image"]) == ("a100", 16, 65536, "")
    job = Job.objects.get()
    assert (job.nodes, job.total_gpus, job.gpu_type, job.cpus, job.memory_mb) == (
        2,
        8,
        "a100",
        16,
        65536,
    )


@pytest.mark.parametrize(
    ("memory", "mib"), [("512M", 512), ("1.5T", 1572864), ("64GiB", 65536), ("2048", 2048)]
)
def test_memory_sizes_in_the_units_people_write(api, memory, mib):
    response = api.post("/jobs", {"entrypoint": ["a"], "memory": memory})
    assert response.status_code == 201, response.content
    assert response.json()["memory_mb"] == mib


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"nodes": 0}, 422, "nodes"),
        ({"nodes": 3, "gpus": 3}, 400, "could hold at most 2 such nodes at once"),
        ({"nodes": 2, "gpus": 5}, 400, "could hold at most 0 such nodes"),
        ({"nodes": 2, "gpus": 10}, 400, "quota is 16; it could never start"),
        ({"gpu_type": "h100"}, 400, "cluster local has no h100 GPUs; it has a100"),
        ({"gpu_type": "a100", "gpus": 0}, 400, "--gpu-type a100 needs GPUs"),
        ({"memory": "lots"}, 400, "--memory 'lots' is not a memory size"),
        ({"memory": "0M"}, 400, "must be from 1M to 64T"),
        ({"cpus": 0}, 422, "cpus"),
        ({"image": "pytorch/pytorch:2.3"}, 400, "runs no container images; leave out --image"),
    ],
)
def test_a_request_that_could_never_run_is_refused_and_creates_nothing(api, body, status, words):
    response = api.post("/jobs", {"entrypoint": ["torchrun", "train.py"], **body})
    assert_refused(response, status, words)
    assert nothing_created()


def test_several_nodes_on_ray_are_refused_with_what_to_do_instead(api, grant):
    ray = grant(
        Cluster.objects.create(name="ray", kind="ray", settings={"address": "http://r:8265"})
    )
    response = api.post("/jobs", {"entrypoint": ["a"], "nodes": 2, "cluster": ray.name})
    assert_refused(response, 400, "use Ray Train")
    assert nothing_created()


def test_a_pool_cluster_that_names_its_types_takes_a_typed_job(api, use_executor):
    class RayLike:
        def __init__(self, cluster) -> None:
            pass

        def capacity(self) -> Capacity:
            return Capacity(reachable=True, total_gpus=8, pool_gpu_types=("A100",))

    use_executor(RayLike)
    assert api.post("/jobs", {"entrypoint": ["a"], "gpu_type": "a100"}).status_code == 201
    assert_refused(api.post("/jobs", {"entrypoint": ["a"], "gpu_type": "h100"}), 400, "has A100")
