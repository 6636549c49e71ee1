"""GPU visibility is the platform's: a job cannot choose which accelerators it sees.

Before, only CUDA_VISIBLE_DEVICES was refused at submit: a 0-GPU job with
NVIDIA_VISIBLE_DEVICES=all (or ROCR_/HIP_VISIBLE_DEVICES) saw GPUs nobody allocated or billed.
The engines' side (a 0-GPU pod always gets NVIDIA_VISIBLE_DEVICES=void) is in
tests/engines/kubernetes/test_pod_isolation.py.
"""

import pytest

from jobs.executors.base import GPU_VISIBILITY_VARS
from jobs.models import Job
from tests.api_helpers import assert_refused

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", sorted(GPU_VISIBILITY_VARS))
@pytest.mark.parametrize("gpus", [0, 1])
def test_a_submit_choosing_its_gpus_is_400_and_stores_nothing(api, name, gpus):
    response = api.post("/jobs", {"entrypoint": ["a"], "gpus": gpus, "env": {name: "all"}})
    assert_refused(response, 400, name, "--gpus")
    assert not Job.objects.exists()


def test_the_usual_suspects_are_all_refused():
    assert {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
    } <= GPU_VISIBILITY_VARS
