"""The whole product on a real Ray: `sf submit --cluster ray` to the ledger's final states.

The stack (ASGI server, Celery worker and beat) runs with a `ray` cluster as the demo team's
default; a real Ray head (4 logical GPUs) runs on this host, and every attempt is a Ray job
submitted through the Jobs API with `entrypoint_num_gpus`, so Ray sets CUDA_VISIBLE_DEVICES.
Ray does not report out-of-memory kills of a job's entrypoint as such (its memory monitor
kills tasks and actors, not the driver), so the out-of-memory row is proven on Kubernetes.
"""

import json
import urllib.request
from collections.abc import Iterator

import pytest

from tests.engines.proof import EngineProof, engine_proof

pytestmark = [pytest.mark.ray, pytest.mark.e2e]


@pytest.fixture(scope="module")
def proof(ray_address, tmp_path_factory) -> Iterator[EngineProof]:
    def alive(job_ref: str) -> bool:
        """True while Ray still runs (or would start) the job."""
        with urllib.request.urlopen(f"{ray_address}/api/jobs/{job_ref}", timeout=10) as answer:
            return json.loads(answer.read())["status"] in ("PENDING", "RUNNING")

    settings = {"address": ray_address, "work_dir": str(tmp_path_factory.mktemp("ray-work"))}
    with engine_proof(tmp_path_factory, "ray", settings, alive) as running_proof:
        yield running_proof


def test_the_example_training_job_runs_on_two_gpus_to_succeeded(proof):
    job = proof.succeeds_with_gpus(2, expect_devices="0,1")
    assert job["job_ref"] == proof.stack.attempts(job["id"])[0]["backend_name"]


def test_pause_stops_the_ray_job_and_resume_continues_from_the_checkpoint(proof):
    proof.pauses_and_resumes()


def test_a_non_zero_exit_fails_the_job_with_its_code(proof):
    proof.fails_with_exit_code(1)


def test_stop_stops_the_ray_job(proof):
    proof.stops()
