"""POST /api/v1/jobs names a job's GPUs per node `gpus_per_node`, and still takes the body /api/v1
has always taken, where `gpus` is per node; answers say `total_gpus` (nodes x GPUs per node) and
keep `gpus` beside it with its meaning of old: in all. /api/v1 breaks no client."""

import pytest

from jobs.executors import Capacity, NodeCapacity
from jobs.models import Job, JobEvent
from jobs.states import JobStatus as S
from tests.api_helpers import assert_refused
from tests.factories import with_attempt

pytestmark = pytest.mark.django_db
GANG = {"entrypoint": ["torchrun", "train.py"], "nodes": 2}


class FourA100Nodes:
    def __init__(self, cluster) -> None:
        pass

    def capacity(self) -> Capacity:
        nodes = tuple(NodeCapacity(f"n{i}", 4, "a100") for i in range(4))
        return Capacity(reachable=True, total_gpus=16, nodes=nodes)


@pytest.fixture(autouse=True)
def _four_nodes(use_executor, team):
    team.gpu_quota = 16
    team.save()
    use_executor(FourA100Nodes)


def submitted(api, body: dict) -> tuple[dict, Job]:
    response = api.post("/jobs", body)
    assert response.status_code == 201, response.content
    answer = response.json()
    return answer, Job.objects.get(pk=answer["id"])


def test_the_body_of_old_with_gpus_per_node_as_gpus_still_works(api):
    answer, job = submitted(api, {**GANG, "gpus": 4})
    assert (job.nodes, job.gpus_per_node, job.total_gpus) == (2, 4, 8)
    assert (answer["gpus_per_node"], answer["total_gpus"], answer["gpus"]) == (4, 8, 8)


def test_the_explicit_name_asks_for_the_same(api):
    answer, job = submitted(api, {**GANG, "gpus_per_node": 4})
    assert (job.nodes, job.gpus_per_node, job.total_gpus) == (2, 4, 8)
    assert (answer["gpus_per_node"], answer["total_gpus"], answer["gpus"]) == (4, 8, 8)


def test_both_names_alike_are_one_request(api):
    _, job = submitted(api, {**GANG, "gpus_per_node": 3, "gpus": 3})
    assert (job.gpus_per_node, job.total_gpus) == (3, 6)


def test_neither_name_asks_for_one_gpu_per_node(api):
    answer, job = submitted(api, GANG)
    assert (job.gpus_per_node, job.total_gpus) == (1, 2)
    assert (answer["gpus_per_node"], answer["total_gpus"]) == (1, 2)


def test_both_names_that_differ_are_refused_with_a_sentence_and_nothing_is_created(api):
    response = api.post("/jobs", {**GANG, "gpus_per_node": 4, "gpus": 2})
    assert_refused(response, 400, "gpus_per_node is 4 but gpus is 2")
    assert "give one of them" in response.json()["detail"]
    assert not Job.objects.exists() and not JobEvent.objects.exists()


@pytest.mark.parametrize("value", [True, "2", 1.5, -1, 1025])
def test_the_explicit_name_is_a_count_as_strict_as_the_old_one(api, value):
    assert_refused(api.post("/jobs", {**GANG, "gpus_per_node": value}), 422, "gpus_per_node")
    assert not Job.objects.exists()


def test_an_array_takes_either_name(api):
    body = {"entrypoint": ["python", "sweep.py"], "array": "0-1", "gpus_per_node": 2}
    response = api.post("/arrays", body)
    assert response.status_code == 201, response.content
    assert set(Job.objects.values_list("total_gpus", flat=True)) == {2}


def test_an_attempt_answers_its_gpus_in_all_under_both_names(api):
    _, job = submitted(api, {**GANG, "gpus_per_node": 4})
    with_attempt(job, S.SUBMITTED, nodes=2)
    [attempt] = api.get(f"/jobs/{job.pk}/attempts").json()
    assert (attempt["total_gpus"], attempt["gpus"], attempt["nodes"]) == (8, 8, 2)
