"""A job waiting for capacity says why the cluster has none, in the executor's words.

Found by the chaos suite: after a slurmctld crash Slurm drained its node, and jobs waited with
"cluster slurm has 0 of 0 GPUs free" and nothing about the drained node.
"""

import pytest

from jobs.executors import Capacity
from jobs.loops.scheduler import admit_queued_jobs
from tests.factories import queued_job

pytestmark = pytest.mark.django_db
DRAINED = "the default partition has no usable nodes (vm drained)"


class NoNodes:
    def capacity(self) -> Capacity:
        return Capacity(reachable=True, total_gpus=0, message=DRAINED)


def test_the_capacity_wait_carries_the_executors_message(
    use_executor, make_team, make_user, monkeypatch
):
    team = make_team("vision", gpu_quota=4)
    job = queued_job(team, make_user("bob", team), total_gpus=1)
    use_executor(lambda cluster: NoNodes())
    admit_queued_jobs()
    job.refresh_from_db()
    assert job.status_reason == (
        f"waiting for capacity: cluster local has 0 of 0 GPUs free ({DRAINED}); this job needs 1"
    )
