"""A cluster is used only by the teams an admin granted it to (issue 47, point 3).

Before: submit took any enabled cluster by name, a team admin could make any cluster the team's
default, and an operators' cluster with `run_as none` ran another team's job as the server's
own user. Now a team uses only the clusters staff granted it (the Django admin, the API,
`manage.py cluster grant`). Submitting, an array, a retry or a resume on any other cluster is
refused with the same 404 and sentence as a cluster that does not exist, so a member cannot
probe which clusters there are; a follow-on is not created there; a team admin chooses a default
only among the team's clusters; a revoke stops the team's queued jobs there at the scheduler's
next tick; and the upgrade grants each team its default and every cluster it has jobs on.
"""

import json
import re
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone

from jobs.bootstrap import ensure_demo
from jobs.ledger import lifecycle
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Cluster, Job, JobArray, JobEvent, Team
from jobs.states import JobStatus as S
from tests.api_helpers import assert_refused, upload_snapshot
from tests.conftest import ApiClient
from tests.factories import place, queued_job

pytestmark = pytest.mark.django_db
BEFORE = ("jobs", "0029_fk_indexes_the_composites_cover")
GRANTS = ("jobs", "0030_cluster_grants")


@pytest.fixture
def ops(make_team) -> Cluster:
    """The operators' cluster: team infra's, granted to nobody else."""
    cluster = Cluster.objects.create(name="ops", kind="noop", settings={"gpus": 8})
    make_team("infra", cluster=cluster)
    return cluster


@pytest.fixture
def root(db) -> User:
    return User.objects.create_user("root", password="pw", is_staff=True, is_superuser=True)


@pytest.fixture
def staff(root) -> ApiClient:
    return ApiClient(root)


@pytest.fixture
def ada(make_user, team) -> ApiClient:
    """vision's team admin."""
    return ApiClient(make_user("ada", team, role="admin"))


def grant(staff: ApiClient, team: str, cluster: str):
    return staff.post(f"/teams/{team}/clusters", {"cluster": cluster})


def revoke(staff: ApiClient, team: str, cluster: str):
    return staff.client.delete(f"/api/v1/teams/{team}/clusters/{cluster}")


def patch(client: ApiClient, path: str, body: dict):
    return client.client.patch(f"/api/v1{path}", json.dumps(body), content_type="application/json")


def refused_like_unknown(answer, name: str, unknown) -> None:
    """`answer` is the 404 an unknown cluster gets, word for word but the name."""
    assert answer.status_code == unknown.status_code == 404, answer.content
    assert answer.json() == {"detail": unknown.json()["detail"].replace("'nowhere'", f"'{name}'")}
    assert "infra" not in answer.json()["detail"]


# -- a member of another team ------------------------------------------------------------------


def test_submitting_to_another_teams_cluster_is_refused_exactly_like_an_unknown_one(api, ops):
    refused = api.post("/jobs", {"entrypoint": ["id"], "cluster": "ops", "gpus": 0})
    unknown = api.post("/jobs", {"entrypoint": ["id"], "cluster": "nowhere", "gpus": 0})
    refused_like_unknown(refused, "ops", unknown)
    assert not Job.objects.exists()
    Team.objects.filter(name="infra").delete()
    ops.delete()  # now it does not exist: the answer is the same, byte for byte
    gone = api.post("/jobs", {"entrypoint": ["id"], "cluster": "ops", "gpus": 0})
    assert (gone.status_code, gone.content) == (refused.status_code, refused.content)


def test_an_array_on_another_teams_cluster_is_refused_exactly_like_an_unknown_one(api, ops):
    body = {"entrypoint": ["python", "train.py", "{index}"], "array": "0-3", "gpus": 0}
    refused = api.post("/arrays", {**body, "cluster": "ops"})
    refused_like_unknown(refused, "ops", api.post("/arrays", {**body, "cluster": "nowhere"}))
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_a_team_admin_may_choose_only_a_granted_cluster_as_default(ada, ops, team, staff):
    refused = patch(ada, "/teams/vision", {"default_cluster": "ops"})
    refused_like_unknown(
        refused, "ops", patch(ada, "/teams/vision", {"default_cluster": "nowhere"})
    )
    team.refresh_from_db()
    assert team.default_cluster.name == "local"
    assert ada.get("/teams/vision").json()["clusters"] == ["local"]
    assert grant(staff, "vision", "ops").status_code == 201
    chosen = patch(ada, "/teams/vision", {"default_cluster": "ops"})
    assert chosen.status_code == 200, chosen.content
    assert chosen.json()["defaults"]["default_cluster"] == "ops"
    assert chosen.json()["clusters"] == ["local", "ops"]


def test_the_console_offers_a_team_admin_only_the_teams_clusters(ada, ops, team):
    console = Client()
    console.force_login(ada.user)
    page = console.get("/teams/vision/").content.decode()
    offered = re.search(r'<select name="default_cluster".*?</select>', page)[0]
    assert re.findall(r"<option[^>]*>([^<]*)</option>", offered) == ["none", "local"]
    assert ">ops<" not in page
    answer = console.post("/teams/vision/defaults/", {"default_cluster": "ops"}, follow=True)
    assert "team vision has no cluster &#x27;ops&#x27;" in answer.content.decode()
    team.refresh_from_db()
    assert team.default_cluster.name == "local"


# -- a revoked grant -----------------------------------------------------------------------------


@pytest.fixture
def on_ops(api, staff, ops) -> dict[str, int]:
    """vision was granted ops and has a job there in each waiting state, then lost the grant."""
    assert grant(staff, "vision", "ops").status_code == 201
    sha = upload_snapshot(api)
    ids = {}
    for state in ("QUEUED", "FAILED", "PAUSED", "retrying"):
        answer = api.post("/jobs", {"entrypoint": ["a"], "cluster": "ops", "snapshot": sha})
        assert answer.status_code == 201, answer.content
        ids[state] = answer.json()["id"]
    place(Job.objects.get(pk=ids["FAILED"]), S.FAILED)
    place(Job.objects.get(pk=ids["PAUSED"]), S.PAUSED)
    retrying = place(Job.objects.get(pk=ids["retrying"]), S.FAILED)  # its cooldown is over
    Job.objects.filter(pk=retrying.pk).update(next_attempt_at=timezone.now(), max_retries=3)
    ids["local"] = api.post("/jobs", {"entrypoint": ["a"], "snapshot": sha}).json()["id"]
    revoked = revoke(staff, "vision", "ops")
    assert revoked.status_code == 200, revoked.content
    assert revoked.json() == {
        "team": "vision",
        "cluster": "ops",
        "default_cleared": False,
        "queued": 1,
    }
    return ids


def test_retry_and_resume_on_a_revoked_cluster_are_refused_like_an_unknown_one(api, on_ops):
    unknown = api.post("/jobs", {"entrypoint": ["a"], "cluster": "nowhere"})
    refused_like_unknown(api.post(f"/jobs/{on_ops['FAILED']}/retry"), "ops", unknown)
    refused_like_unknown(api.post(f"/jobs/{on_ops['PAUSED']}/resume"), "ops", unknown)
    assert Job.objects.get(pk=on_ops["FAILED"]).status == S.FAILED
    assert Job.objects.get(pk=on_ops["FAILED"]).retry_count == 0
    assert Job.objects.get(pk=on_ops["PAUSED"]).status == S.PAUSED


def test_an_arrays_retry_on_a_revoked_cluster_moves_no_task(api, staff, ops):
    assert grant(staff, "vision", "ops").status_code == 201
    body = {"entrypoint": ["a", "{index}"], "array": "0-2", "cluster": "ops"}
    array = api.post("/arrays", {**body, "snapshot": upload_snapshot(api)}).json()["id"]
    for task in Job.objects.filter(array_id=array):
        place(task, S.FAILED)
    assert revoke(staff, "vision", "ops").status_code == 200
    unknown = api.post("/jobs", {"entrypoint": ["a"], "cluster": "nowhere"})
    refused_like_unknown(api.post(f"/arrays/{array}/retry"), "ops", unknown)
    assert set(Job.objects.filter(array_id=array).values_list("status", flat=True)) == {S.FAILED}


def test_the_scheduler_stops_what_waits_on_a_revoked_cluster_and_admits_none_of_it(on_ops):
    first = admit_queued_jobs()
    ended = {on_ops["QUEUED"], on_ops["retrying"]}  # the due automatic retry came back, stopped
    assert set(first.ungranted) == ended
    for pk in ended:
        job = Job.objects.get(pk=pk)
        assert job.status == S.STOPPED
        assert "team vision may no longer use cluster ops" in job.status_reason
        assert not Attempt.objects.filter(job=job).exists()
    assert Job.objects.get(pk=on_ops["local"]).status == S.SUBMITTED  # its own cluster: admitted
    assert Job.objects.get(pk=on_ops["PAUSED"]).status == S.PAUSED  # stays until it would queue
    events = JobEvent.objects.count()
    assert admit_queued_jobs().ungranted == [] and JobEvent.objects.count() == events


def test_a_follow_on_is_not_created_on_a_cluster_the_team_may_no_longer_use(
    team, alice, staff, ops
):
    assert grant(staff, "vision", "ops").status_code == 201
    spec = {"eval": {"entrypoint": ["python", "eval.py"], "gpus": 0}}
    parent = queued_job(team, alice, cluster=ops, then=["eval"], follow_on_specs=spec)
    assert revoke(staff, "vision", "ops").status_code == 200
    place(parent, S.SUCCEEDED)
    with transaction.atomic():
        assert lifecycle.after_success(parent.pk) == []
    assert not Job.objects.filter(parent=parent).exists()
    note = JobEvent.objects.filter(job=parent, kind=JobEvent.Kind.NOTE).get().reason
    assert note == (
        "follow-on jobs eval were not created: team vision may no longer use cluster ops"
    )


def test_revoking_the_teams_default_clears_it_and_submit_then_asks_for_a_cluster(api, staff):
    answer = revoke(staff, "vision", "local")
    assert answer.json()["default_cleared"] is True
    assert Team.objects.get(name="vision").default_cluster is None
    refused = assert_refused(api.post("/jobs", {"entrypoint": ["a"]}), 400, "no default cluster")
    assert refused["detail"].endswith("(clusters it may use: none yet (ask an admin to grant one))")


# -- who grants: staff, through the API, the admin and manage.py --------------------------------


def test_only_staff_grant_and_revoke_through_the_api(ada, staff, ops):
    assert_refused(grant(ada, "vision", "ops"), 403, "only staff grant and revoke clusters")
    assert_refused(revoke(ada, "vision", "local"), 403, "only staff")
    assert_refused(grant(staff, "vision", "nowhere"), 400, "known clusters: local, ops")
    assert grant(staff, "vision", "ops").status_code == 201
    again = grant(staff, "vision", "ops")
    assert again.status_code == 200 and again.json()["granted"] is False
    assert revoke(staff, "vision", "ops").status_code == 200
    assert_refused(revoke(staff, "vision", "ops"), 404, "team vision has no grant of cluster ops")
    assert [t["clusters"] for t in staff.get("/teams").json()] == [["ops"], ["local"]]


def test_manage_py_cluster_grants_revokes_and_lists_the_teams(team, ops, make_team):
    make_team("nlp")
    out = StringIO()
    call_command("cluster", "grant", "ops", "vision", "nlp", stdout=out)
    assert "team nlp may now use cluster ops" in out.getvalue()
    call_command("cluster", "list", stdout=out)
    assert "teams: infra, nlp, vision" in out.getvalue()
    call_command("cluster", "revoke", "ops", "nlp", "infra", stdout=out)
    assert "team nlp may no longer use cluster ops\n" in out.getvalue()
    assert "team infra may no longer use cluster ops; it was the team's default" in out.getvalue()
    listed = StringIO()
    call_command("cluster", "list", stdout=listed)
    assert "\tteams: vision\n" in listed.getvalue()
    with pytest.raises(CommandError, match="team nlp has no grant of cluster ops"):
        call_command("cluster", "revoke", "ops", "nlp")
    with pytest.raises(CommandError, match="no team named nobody"):
        call_command("cluster", "grant", "ops", "nobody")
    call_command("cluster", "add", "gpu", "--kind", "noop", "--default-for", "nlp", stdout=out)
    assert "\tteams: nlp\n" in _listing()


def _listing() -> str:
    out = StringIO()
    call_command("cluster", "list", stdout=out)
    return out.getvalue()


def test_the_admin_grants_and_revokes_on_the_clusters_page(root, team, ops):
    admin = Client()
    admin.force_login(root)
    page = f"/admin/jobs/cluster/{ops.pk}/change/"
    form = {"name": "ops", "kind": "noop", "settings": '{"gpus": 8}', "enabled": "on"}
    form |= {f"shares-{k}": v for k, v in {"TOTAL_FORMS": 0, "INITIAL_FORMS": 0}.items()}
    infra = ops.grants.get()
    added = {
        "grants-TOTAL_FORMS": 2,
        "grants-INITIAL_FORMS": 1,
        "grants-0-id": infra.pk,
        "grants-0-cluster": ops.pk,
        "grants-1-team": team.pk,
        "grants-1-cluster": ops.pk,
    }
    assert admin.post(page, form | added).status_code == 302
    assert "\tteams: infra, vision\n" in _listing()
    assert ops.grants.get(team=team).granted_by == "root"
    removed = {**added, "grants-TOTAL_FORMS": 1, "grants-0-DELETE": "on"}
    del removed["grants-1-team"], removed["grants-1-cluster"]
    assert admin.post(page, form | removed).status_code == 302
    assert "\tteams: vision\n" in _listing()
    assert Team.objects.get(name="infra").default_cluster is None  # revoked: no default now
    for shown in (page, f"/admin/jobs/team/{team.pk}/change/", "/admin/jobs/cluster/"):
        assert "vision" in admin.get(shown).content.decode()


# -- existing installations ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_upgrade_grants_each_team_its_default_and_the_clusters_it_has_jobs_on():
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    old = executor.loader.project_state([BEFORE]).apps
    cluster, team = old.get_model("jobs", "Cluster"), old.get_model("jobs", "Team")
    home, used, elsewhere = (
        cluster.objects.create(name=name, kind="noop") for name in ("home", "used", "elsewhere")
    )
    vision = team.objects.create(name="vision", default_cluster=home)
    nlp = team.objects.create(name="nlp")
    user = old.get_model("auth", "User").objects.create(username="alice")
    for status in ("SUCCEEDED", "QUEUED"):  # whatever their state: a team used it
        old.get_model("jobs", "Job").objects.create(
            run_id=f"r-{status}", team=nlp, user=user, cluster=used, entrypoint=["a"], status=status
        )
    executor = MigrationExecutor(connection)
    executor.migrate([GRANTS])
    new = executor.loader.project_state([GRANTS]).apps
    granted = new.get_model("jobs", "ClusterGrant").objects.values_list("team_id", "cluster_id")
    assert sorted(granted) == sorted([(vision.pk, home.pk), (nlp.pk, used.pk)])
    assert elsewhere.pk not in {c for _, c in granted}
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("jobs"))


def test_the_demo_team_may_use_the_local_cluster_from_the_first_start(settings, tmp_path, staff):
    settings.VAR_DIR = tmp_path / "var"
    demo = ApiClient(User.objects.get(username=ensure_demo().username))
    assert demo.get("/teams/demo").json()["clusters"] == ["local"]
    assert demo.post("/jobs", {"entrypoint": ["id"], "gpus": 0}).status_code == 201
    assert revoke(staff, "demo", "local").status_code == 200
    ensure_demo()  # the next start gives back no grant an admin took
    assert demo.get("/teams/demo").json()["clusters"] == []
    assert Team.objects.get(name="demo").default_cluster is None
