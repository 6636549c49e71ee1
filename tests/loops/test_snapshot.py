"""`jobs.loops.snapshot`: what a tick decides from is read up front, in as many queries however
many jobs wait or run (the active jobs once, a row each, the queue once), and the engines are
asked once per tick with what they said recorded for the reads."""

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.executors import Capacity, NodeCapacity
from jobs.loops.snapshot import cluster_capacities, read_rules, read_snapshot
from jobs.models import Cluster, JobArray
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus
NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def capacities(cluster: Cluster) -> dict:
    """A cluster that reports its nodes: the active jobs' ranks are read too."""
    nodes = (NodeCapacity("a", 8), NodeCapacity("b", 8))
    return {cluster.pk: (cluster, Capacity(reachable=True, total_gpus=16, nodes=nodes))}


def jobs(team, user, waiting: int, running: int) -> None:
    array = JobArray.objects.create(team=team, user=user, spec="0-99", size=100, max_parallel=2)
    for n in range(waiting):
        queued_job(team, user, array=array if n % 2 else None)
    for n in range(running):
        with_attempt(queued_job(team, user, array=array if n % 2 else None), S.RUNNING)


def queries(team, user, waiting: int, running: int) -> int:
    jobs(team, user, waiting, running)
    rules = read_rules(NOW)
    with CaptureQueriesContext(connection) as read:
        read_snapshot(NOW, rules, capacities(team.default_cluster))
    return len(read)


def test_a_snapshot_reads_as_many_queries_however_many_jobs_wait_or_run(team, alice):
    few = queries(team, alice, waiting=2, running=2)
    assert queries(team, alice, waiting=40, running=30) == few


def test_the_active_jobs_are_read_once_with_their_attempts_and_the_tasks_of_capped_arrays(
    team, alice
):
    jobs(team, alice, waiting=2, running=3)
    snap = read_snapshot(NOW, read_rules(NOW), capacities(team.default_cluster))
    assert len(snap.active) == 3 and all(a.attempt is not None for a in snap.active)
    assert all(a.ranks == [] for a in snap.active)  # read: the cluster reports its nodes
    [array] = {j.array for j in snap.queue[team.pk] if j.array is not None}
    assert snap.array_tasks == {array: 1}  # the second of the three running


def test_fair_shares_usage_is_read_only_where_two_teams_wait(make_team, make_user):
    vision, nlp = make_team("vision"), make_team("nlp")
    queued_job(vision, make_user("ann", vision))
    rules = read_rules(NOW)
    with CaptureQueriesContext(connection) as alone:
        assert read_snapshot(NOW, rules, {}).recent_us == {}
    queued_job(nlp, make_user("bob", nlp))
    with CaptureQueriesContext(connection) as two:
        read_snapshot(NOW, rules, {})
    assert len(two) > len(alone)


def test_an_engine_that_fails_is_recorded_unreachable_and_the_others_are_still_asked(
    use_executor, local_cluster, noop_cluster
):
    Cluster.objects.create(name="off", kind="noop", settings={"gpus": 1}, enabled=False)
    asked = []

    class Engine:
        def __init__(self, cluster: Cluster) -> None:
            self.cluster = cluster

        def capacity(self) -> Capacity:
            asked.append(self.cluster.name)
            if self.cluster.name == "local":
                raise OSError("no route to host")
            return Capacity(reachable=True, total_gpus=4)

    use_executor(Engine)
    seen = cluster_capacities()
    assert sorted(asked) == ["bench", "local"]  # a disabled cluster is not asked
    assert seen[local_cluster.pk][1] == Capacity(
        reachable=False, message="OSError: no route to host"
    )
    assert seen[noop_cluster.pk][1].total_gpus == 4
    local_cluster.refresh_from_db()
    assert local_cluster.unreachable_reason == "OSError: no route to host"
    assert local_cluster.unreachable_since is not None


def test_with_nothing_queued_no_active_job_is_read(team, alice):
    jobs(team, alice, waiting=0, running=3)
    snap = read_snapshot(NOW, read_rules(NOW), {})
    assert (snap.queue, snap.active) == ({}, [])
