"""`jobs.actions.submit` checks each follow-on as the job it will be (`jobs.ledger.creation`):
one node asking for its parent's GPU type, so a follow-on no node of that type could ever hold
is refused at submit, nothing created, rather than left waiting for good."""

import pytest

from jobs.actions.submit import submit_job
from jobs.errors import BadRequest
from jobs.executors import Capacity, NodeCapacity
from jobs.models import Job, JobEvent
from jobs.schemas import JobIn
from tests.api_helpers import upload_files

pytestmark = pytest.mark.django_db


class TypedNodes:
    """Two nodes of 4 a100 GPUs and one of 8 h100: 16 in all."""

    def __init__(self, cluster) -> None:
        pass

    def capacity(self) -> Capacity:
        nodes = (NodeCapacity("a1", 4, "a100"), NodeCapacity("a2", 4, "a100"))
        return Capacity(True, 16, nodes=(*nodes, NodeCapacity("h1", 8, "h100")))


@pytest.fixture(autouse=True)
def _typed_nodes(use_executor, team):
    team.gpu_quota = 16
    team.save()
    use_executor(TypedNodes)


def snapshot_with(api, eval_gpus: int) -> str:
    project = f'[then.eval]\nentrypoint = "python eval.py"\ngpus = {eval_gpus}\n'
    return upload_files(api, {"starforge.toml": project.encode()})


def request(sha: str, **fields) -> JobIn:
    return JobIn(entrypoint=["python", "train.py"], then=["eval"], snapshot=sha, **fields)


def test_a_follow_on_wanting_more_of_its_parents_gpu_type_than_a_node_has_is_refused(alice, api):
    sha = snapshot_with(api, eval_gpus=8)
    with pytest.raises(BadRequest) as refused:
        submit_job(alice, request(sha, gpus=2, gpu_type="a100"))
    assert str(refused.value) == (
        "[then.eval] asks for 8 a100 GPUs (its parent's type) on one node but cluster local "
        "has no such node; it could never start"
    )
    assert not Job.objects.exists() and not JobEvent.objects.exists()


def test_a_follow_on_that_fits_a_node_of_its_parents_type_is_accepted(alice, api):
    job = submit_job(alice, request(snapshot_with(api, eval_gpus=4), gpus=2, gpu_type="a100"))
    assert job.follow_on_specs == {"eval": {"entrypoint": ["python", "eval.py"], "gpus": 4}}


def test_a_parent_without_a_gpu_type_lets_its_follow_on_use_any_node(alice, api):
    job = submit_job(alice, request(snapshot_with(api, eval_gpus=8), gpus=2))
    assert job.follow_on_specs["eval"]["gpus"] == 8
