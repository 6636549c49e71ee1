"""`jobs.grants`, the one rule of which clusters a team may use, and how a team's default
cluster stays one of them (tests/hostile/test_cluster_grants.py holds the refusals)."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import grants
from jobs.errors import BadRequest, NotFound
from jobs.models import Cluster, ClusterGrant, Job, Team
from tests.conftest import ApiClient
from tests.factories import place, queued_job

pytestmark = pytest.mark.django_db


def clusters_of(team: Team) -> list[str]:
    return grants.usable_names(team)


def test_saving_a_team_with_a_default_grants_it_and_nothing_else(local_cluster):
    gpu = Cluster.objects.create(name="gpu", kind="noop")
    team = Team.objects.create(name="vision", default_cluster=local_cluster)
    assert clusters_of(team) == ["local"]
    team.default_cluster = gpu
    team.save()
    assert clusters_of(team) == ["gpu", "local"]  # the old default stays granted
    assert ClusterGrant.objects.get(team=team, cluster=gpu).granted_by == ""


def test_staff_choosing_a_default_through_the_api_grants_it(make_user, team):
    root = make_user("root")
    root.is_staff = True
    root.save()
    Cluster.objects.create(name="gpu", kind="noop")
    answer = ApiClient(root).client.patch(
        "/api/v1/teams/vision", json.dumps({"default_cluster": "gpu"}), "application/json"
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["clusters"] == ["gpu", "local"]
    assert ClusterGrant.objects.get(team=team, cluster__name="gpu").granted_by == "root"


def test_without_a_default_submit_takes_local_only_where_granted(team, local_cluster):
    Team.objects.filter(pk=team.pk).update(default_cluster=None)
    team.refresh_from_db()
    assert grants.usable_cluster(team) == local_cluster
    ClusterGrant.objects.filter(team=team).delete()
    with pytest.raises(BadRequest, match=r"no default cluster; pass --cluster \(clusters it"):
        grants.usable_cluster(team)


def test_a_default_nobody_granted_is_refused_by_its_name(team):
    gpu = Cluster.objects.create(name="gpu", kind="noop")
    Team.objects.filter(pk=team.pk).update(default_cluster=gpu)  # behind Team.save's back
    team.refresh_from_db()
    with pytest.raises(NotFound, match="team vision has no cluster 'gpu'; clusters it may use"):
        grants.usable_cluster(team)


def test_a_named_cluster_is_resolved_in_one_query(team, local_cluster):
    grants.usable_cluster(team, "local")  # the SQL is built on first use
    with CaptureQueriesContext(connection) as queries:
        assert grants.usable_cluster(team, "local") == local_cluster
    assert len(queries) == 1


def test_queued_jobs_without_a_grant_are_found_in_one_query(team, alice, local_cluster):
    gpu = Cluster.objects.create(name="gpu", kind="noop")
    kept = queued_job(team, alice)
    lost = queued_job(team, alice, cluster=gpu)  # the factory grants gpu, as a submit needed
    place(queued_job(team, alice, cluster=gpu), "RUNNING")  # running: not waiting
    assert grants.queued_without_grant() == []
    grants.revoke(team, gpu, "test")
    with CaptureQueriesContext(connection) as queries:
        assert grants.queued_without_grant() == [(lost.pk, "vision", "gpu")]
    assert len(queries) == 1
    assert Job.objects.get(pk=kept.pk).status == "QUEUED"
