"""Gang admission: a multi-node job starts only when every one of its nodes has room at once,
counted per node and per GPU type, never as a cluster sum; quotas count nodes x GPUs."""

import pytest

from jobs.executors import Capacity, NodeCapacity
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Cluster, Job, TeamGpuTypeQuota
from jobs.states import JobStatus
from tests.factories import place, queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus


def nodes(*spec: tuple[str, int, str], share: bool = False):
    """An executor whose capacity is these nodes (name, GPUs free to Starforge, type)."""
    capacity = Capacity(
        reachable=True,
        total_gpus=sum(g for _, g, _ in spec),
        nodes=tuple(NodeCapacity(n, g, t) for n, g, t in spec),
        ranks_share_nodes=share,
    )

    class Nodes:
        def capacity(self) -> Capacity:
            return capacity

    return lambda cluster: Nodes()


@pytest.fixture
def gang(make_team, make_user):
    team = make_team("vision", gpu_quota=64)
    user = make_user("bob", team)

    def make(nodes: int, gpus_per_node: int, gpu_type: str = "", **fields) -> Job:
        return queued_job(
            team, user, total_gpus=nodes * gpus_per_node, nodes=nodes, gpu_type=gpu_type, **fields
        )

    make.team, make.user = team, user
    return make


def status(job: Job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.status, job.status_reason


def test_two_by_four_does_not_start_on_eight_gpus_spread_three_three_two(use_executor, gang):
    use_executor(nodes(("n1", 3, "a100"), ("n2", 3, "a100"), ("n3", 2, "a100")))
    job = gang(2, 4, "a100")
    assert admit_queued_jobs().admitted == []
    assert status(job) == (
        S.QUEUED,
        "waiting for 2 nodes with 4 free a100 GPUs each: 0 such nodes free on cluster local",
    )


def test_the_reason_counts_the_nodes_that_do_have_room(use_executor, gang):
    use_executor(nodes(("n1", 4, "a100"), ("n2", 3, "a100"), ("n3", 4, "h100")))
    job = gang(2, 4, "a100")
    admit_queued_jobs()
    assert status(job)[1] == (
        "waiting for 2 nodes with 4 free a100 GPUs each: 1 such node free on cluster local"
    )


def test_it_starts_when_every_node_has_room_and_its_attempt_has_the_nodes(use_executor, gang):
    use_executor(nodes(("n1", 4, "a100"), ("n2", 4, "a100")))
    job = gang(2, 4, "a100")
    admitted = admit_queued_jobs().admitted
    attempt = Attempt.objects.get(pk__in=admitted)
    assert status(job)[0] == S.SUBMITTED
    assert (attempt.job_id, attempt.total_gpus, attempt.nodes) == (job.pk, 8, 2)


def test_one_tick_never_places_two_gangs_on_the_same_gpus(use_executor, gang):
    use_executor(nodes(("n1", 4, ""), ("n2", 4, ""), ("n3", 4, "")))
    first, second = gang(2, 4), gang(2, 2)  # 4 GPUs are left, but all on one node
    admit_queued_jobs()
    assert status(first)[0] == S.SUBMITTED
    assert status(second) == (
        S.QUEUED,
        "waiting for 2 nodes with 2 free GPUs each: 1 such node free on cluster local",
    )


def test_running_ranks_hold_the_nodes_the_engine_reported(use_executor, gang):
    use_executor(nodes(("n1", 4, ""), ("n2", 4, ""), ("n3", 4, "")))
    running = gang(2, 4)
    attempt = with_attempt(running, S.RUNNING, nodes=2)
    Attempt.objects.filter(pk=attempt.pk).update(
        ranks=[
            {"rank": 0, "node": "n1", "state": "running", "exit_code": None},
            {"rank": 1, "node": "n3", "state": "running", "exit_code": None},
        ]
    )
    wide, narrow = gang(2, 4), gang(1, 4)
    admit_queued_jobs()
    assert status(wide)[0] == S.QUEUED  # only n2 is free
    assert status(narrow)[0] == S.SUBMITTED  # and it takes n2


def test_a_job_without_a_type_takes_any_and_a_typed_one_only_its_own(use_executor, gang):
    use_executor(nodes(("n1", 2, "NVIDIA-A100-SXM4-80GB"), ("n2", 2, "h100")))
    typed, any_type = gang(1, 2, "h100"), gang(1, 2)
    admit_queued_jobs()
    assert status(typed)[0] == status(any_type)[0] == S.SUBMITTED


def test_a_short_type_matches_the_product_name_the_engine_reports(use_executor, gang):
    use_executor(nodes(("n1", 2, "NVIDIA-A100-SXM4-80GB"), ("n2", 2, "NVIDIA A100 80GB PCIe")))
    job = gang(2, 2, "a100")
    admit_queued_jobs()
    assert status(job)[0] == S.SUBMITTED


def test_ranks_may_share_a_node_where_the_engine_allows_it(use_executor, gang):
    use_executor(nodes(("host", 8, ""), share=True))
    fits, waits = gang(2, 4), gang(2, 2)
    admit_queued_jobs()
    assert status(fits)[0] == S.SUBMITTED
    assert status(waits) == (
        S.QUEUED,
        "waiting for capacity: cluster local has 0 of 8 GPUs free; this job needs 4",
    )


def test_the_quota_counts_nodes_times_gpus(use_executor, gang):
    use_executor(nodes(("n1", 8, ""), ("n2", 8, ""), ("n3", 8, "")))
    gang.team.gpu_quota = 12
    gang.team.save()
    place(gang(1, 8), S.RUNNING)
    job = gang(2, 4)
    admit_queued_jobs()
    assert status(job) == (
        S.QUEUED,
        "waiting for quota: team vision uses 8 of 12 GPUs; this job needs 8",
    )


def test_a_pool_cluster_without_nodes_counts_the_sum_as_before(use_executor, gang):
    cluster = Cluster.objects.get(name="local")

    class Pool:
        def capacity(self) -> Capacity:
            return Capacity(reachable=True, total_gpus=8)

    use_executor(lambda c: Pool(), cluster)
    job = gang(2, 4)
    admit_queued_jobs()
    assert status(job)[0] == S.SUBMITTED


# -- a team's quota per GPU type (optional, set in the admin) ----------------------------------


def cap(team, gpu_type: str, gpus: int) -> None:
    TeamGpuTypeQuota.objects.create(team=team, gpu_type=gpu_type, gpus=gpus)


def test_a_type_quota_holds_back_jobs_of_that_type_only(use_executor, gang):
    use_executor(nodes(("a1", 8, "a100"), ("a2", 8, "a100"), ("h1", 8, "h100")))
    cap(gang.team, "a100", 8)
    first, second, other = gang(2, 4, "a100"), gang(1, 4, "a100"), gang(1, 4, "h100")
    admit_queued_jobs()
    assert status(first)[0] == status(other)[0] == S.SUBMITTED
    assert status(second) == (
        S.QUEUED,
        "waiting for quota: team vision uses 8 of its 8 a100 GPUs; this job needs 4",
    )


def test_the_type_quota_matches_product_names_and_counts_running_jobs(use_executor, gang):
    use_executor(nodes(("a1", 8, "NVIDIA-A100-SXM4-80GB"), ("a2", 8, "NVIDIA-A100-SXM4-80GB")))
    cap(gang.team, "a100", 6)
    place(gang(1, 4, "a100"), S.RUNNING)
    job = gang(1, 4, "A100")
    admit_queued_jobs()
    assert (
        status(job)[1]
        == "waiting for quota: team vision uses 4 of its 6 a100 GPUs; this job needs 4"
    )


def test_a_job_without_a_type_keeps_off_a_type_whose_quota_is_used_up(use_executor, gang):
    use_executor(nodes(("a1", 8, "a100"), ("h1", 2, "h100")))
    cap(gang.team, "a100", 4)
    running = gang(1, 4)  # asked for no type; the engine reports it on a1
    attempt = with_attempt(running, S.RUNNING)
    Attempt.objects.filter(pk=attempt.pk).update(
        ranks=[{"rank": 0, "node": "a1", "state": "running", "exit_code": None}]
    )
    wide, narrow = gang(1, 3), gang(1, 2)
    admit_queued_jobs()
    # a1 has 4 GPUs free, but the team's a100 GPUs are used up: only h1 (2 free) is left.
    assert status(wide) == (
        S.QUEUED,
        "waiting for 1 node with 3 free GPUs: 0 such nodes free on cluster local",
    )
    assert status(narrow)[0] == S.SUBMITTED


def test_a_typeless_job_counts_toward_the_type_it_was_placed_on(use_executor, gang):
    use_executor(nodes(("a1", 8, "a100"), ("h1", 8, "h100")))
    cap(gang.team, "a100", 4)
    cap(gang.team, "h100", 4)
    jobs = [gang(1, 4), gang(1, 4), gang(1, 4)]
    admit_queued_jobs()
    assert [status(j)[0] for j in jobs] == [S.SUBMITTED, S.SUBMITTED, S.QUEUED]
