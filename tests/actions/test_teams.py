"""Teams and roles: members read their teams; team admins and staff manage members and defaults,
through the API (/api/v1/teams) and the console (/teams/); quotas stay staff's."""

import json
import threading
import time

import pytest
from django.db import connection, transaction
from django.test import Client

from jobs.actions import teams
from jobs.errors import ApiError
from jobs.models import Cluster, Membership, ScheduleWindow, Team
from tests.api_helpers import assert_refused

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    """Four users per test: PBKDF2's deliberate slowness would dominate the suite."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def patch(api, path: str, body: dict):
    return api.client.patch(f"/api/v1{path}", json.dumps(body), content_type="application/json")


def delete(api, path: str):
    return api.client.delete(f"/api/v1{path}")


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def roles(team: Team) -> dict[str, str]:
    return dict(Membership.objects.filter(team=team).values_list("user__username", "role"))


@pytest.fixture
def admin(make_user, team):
    return make_user("ada", team, role="admin")


@pytest.fixture
def admin_api(api_as, admin):
    return api_as(admin)


@pytest.fixture
def carol(make_user):
    return make_user("carol")


# -- reading -------------------------------------------------------------------------------------


def test_a_member_sees_their_teams_with_roles_quotas_and_defaults(api, admin, make_team, team):
    Team.objects.filter(pk=team.pk).update(max_jobs=3, gpu_hours_per_month=120, user_gpu_cap=2)
    make_team("nlp")
    listed = api.get("/teams").json()
    assert [t["name"] for t in listed] == ["vision"]
    vision = listed[0]
    assert vision["role"] == "member" and vision["can_manage"] is False
    assert vision["members"] == [
        {"username": "ada", "role": "admin"},
        {"username": "alice", "role": "member"},
    ]
    assert vision["quotas"] == {
        "gpu_quota": 8,
        "max_jobs": 3,
        "gpu_hours_per_month": 120.0,
        "money_budget_per_month": None,
        "budget_alert_percents": "50,80,100",
        "budget_hard_stop": False,
        "user_gpu_cap": 2,
        "max_gpus_per_job": None,
        "max_member_priority": 10,
    }
    assert vision["defaults"] == {
        "default_cluster": "local",
        "window": None,
        "default_max_retries": 0,
        "default_retry_cooldown_s": 30,
        "default_time_limit_s": None,
    }
    assert api.get("/teams/vision").json() == vision


def test_another_team_is_404_and_staff_see_every_team(api, api_as, make_team, make_user):
    make_team("nlp")
    assert_refused(api.get("/teams/nlp"), 404, "team nlp does not exist or you are not in it")
    assert_refused(api.get("/teams/nope"), 404, "team nope does not exist")
    staff = make_user("root")
    staff.is_staff = True
    staff.save()
    as_staff = api_as(staff)
    assert [t["name"] for t in as_staff.get("/teams").json()] == ["nlp", "vision"]
    nlp = as_staff.get("/teams/nlp").json()
    assert nlp["role"] is None and nlp["can_manage"] is True


# -- managing members ----------------------------------------------------------------------------


def test_a_team_admin_adds_changes_and_removes_a_member(admin_api, team, carol):
    response = admin_api.post("/teams/vision/members", {"username": "carol", "role": "viewer"})
    assert response.status_code == 201, response.content
    assert response.json() == {"username": "carol", "role": "viewer"}
    assert patch(admin_api, "/teams/vision/members/carol", {"role": "member"}).json() == {
        "username": "carol",
        "role": "member",
    }
    assert roles(team)["carol"] == "member"
    assert delete(admin_api, "/teams/vision/members/carol").status_code == 204
    assert "carol" not in roles(team)


def test_adding_defaults_to_the_member_role(admin_api, team, carol):
    assert admin_api.post("/teams/vision/members", {"username": "carol"}).status_code == 201
    assert roles(team)["carol"] == "member"


def test_a_member_or_viewer_cannot_manage_members(api, api_as, make_user, team, carol):
    viewer = api_as(make_user("vic", team, role="viewer"))
    for client in (api, viewer):
        assert_refused(
            client.post("/teams/vision/members", {"username": "carol"}),
            403,
            "only team admins of team vision can manage its members",
        )
        assert_refused(patch(client, "/teams/vision/members/alice", {"role": "admin"}), 403)
        assert_refused(delete(client, "/teams/vision/members/alice"), 403)
        assert_refused(patch(client, "/teams/vision", {"default_max_retries": 3}), 403)
    assert roles(team) == {"alice": "member", "vic": "viewer"}


def test_an_admin_of_one_team_cannot_touch_another(admin_api, make_team, make_user):
    nlp = make_team("nlp")
    make_user("bob", nlp, role="admin")
    assert_refused(
        admin_api.post("/teams/nlp/members", {"username": "ada"}),
        404,
        "team nlp does not exist or you are not in it",
    )
    assert_refused(delete(admin_api, "/teams/nlp/members/bob"), 404)
    assert_refused(patch(admin_api, "/teams/nlp", {"default_max_retries": 1}), 404)
    assert roles(nlp) == {"bob": "admin"}


def test_staff_manage_any_team(api_as, make_user, make_team, carol):
    nlp = make_team("nlp")
    staff = make_user("root")
    staff.is_staff = True
    staff.save()
    response = api_as(staff).post("/teams/nlp/members", {"username": "carol", "role": "admin"})
    assert response.status_code == 201
    assert roles(nlp) == {"carol": "admin"}


def test_an_unknown_user_is_400_and_an_existing_member_409(admin_api, alice):
    assert_refused(
        admin_api.post("/teams/vision/members", {"username": "ghost"}), 400, "unknown user 'ghost'"
    )
    assert_refused(
        admin_api.post("/teams/vision/members", {"username": "alice", "role": "admin"}),
        409,
        "alice is already in team vision as member",
    )


def test_a_role_outside_the_three_is_refused(admin_api, carol):
    response = admin_api.post("/teams/vision/members", {"username": "carol", "role": "owner"})
    assert_refused(response, 422, "role")
    assert_refused(patch(admin_api, "/teams/vision/members/alice", {"role": "boss"}), 422, "role")


def test_changing_or_removing_someone_outside_the_team_is_404(admin_api, carol):
    assert_refused(
        patch(admin_api, "/teams/vision/members/carol", {"role": "viewer"}),
        404,
        "carol is not a member of team vision",
    )
    assert_refused(delete(admin_api, "/teams/vision/members/carol"), 404, "not a member")


def test_the_last_admin_cannot_be_demoted_or_removed(admin_api, alice, team):
    assert_refused(
        patch(admin_api, "/teams/vision/members/ada", {"role": "member"}),
        409,
        "ada is the last admin of team vision",
    )
    assert_refused(delete(admin_api, "/teams/vision/members/ada"), 409, "last admin")
    assert roles(team)["ada"] == "admin"
    patch(admin_api, "/teams/vision/members/alice", {"role": "admin"})
    assert patch(admin_api, "/teams/vision/members/ada", {"role": "viewer"}).status_code == 200
    assert roles(team) == {"alice": "admin", "ada": "viewer"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_admins_demoting_each_other_at_once_leave_the_team_one_admin(make_user, team):
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (run by `make test`)")
    first, second = make_user("a1", team, role="admin"), make_user("a2", team, role="admin")
    results: dict[str, object] = {}

    def demote(actor, target: str) -> None:
        try:
            teams.change_role(actor, "vision", target, "member")
            results[actor.username] = "done"
        except ApiError as exc:
            results[actor.username] = exc.status
        finally:
            connection.close()

    threads = [
        threading.Thread(target=demote, args=(first, "a2")),
        threading.Thread(target=demote, args=(second, "a1")),
    ]
    with transaction.atomic():  # hold the team row: both have read their role and now queue
        Team.objects.select_for_update().get(pk=team.pk)
        for thread in threads:
            thread.start()
        time.sleep(0.5)
    for thread in threads:
        thread.join()
    assert sorted(results.values(), key=str) == [403, "done"]
    assert list(roles(team).values()).count("admin") == 1


def test_a_removed_member_loses_the_team_at_once(api, admin_api):
    assert delete(admin_api, "/teams/vision/members/alice").status_code == 204
    assert api.get("/teams").json() == []
    assert_refused(api.get("/teams/vision"), 404)


# -- defaults ------------------------------------------------------------------------------------


def test_a_team_admin_sets_defaults_by_name_and_only_what_was_sent(admin_api, grant):
    grant(Cluster.objects.create(name="gpu-slurm", kind="slurm", settings={}))
    ScheduleWindow.objects.create(name="nights", spec="mon-fri 20:00-08:00")
    response = patch(
        admin_api,
        "/teams/vision",
        {"default_cluster": "gpu-slurm", "window": "nights", "default_max_retries": 2},
    )
    assert response.status_code == 200, response.content
    assert response.json()["defaults"] == {
        "default_cluster": "gpu-slurm",
        "window": "nights",
        "default_max_retries": 2,
        "default_retry_cooldown_s": 30,
        "default_time_limit_s": None,
    }
    cleared = patch(admin_api, "/teams/vision", {"window": None}).json()["defaults"]
    assert cleared["window"] is None and cleared["default_cluster"] == "gpu-slurm"


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"default_cluster": "nowhere"}, 404, "no cluster 'nowhere'; clusters it may use: local"),
        ({"window": "never"}, 400, "unknown schedule window 'never'"),
        ({"default_max_retries": 101}, 400, "default_max_retries must be a whole number from 0"),
        ({"default_max_retries": -1}, 400, "from 0 to 100"),
        ({"default_retry_cooldown_s": 86401}, 400, "from 0 to 86400"),
        ({"default_retry_cooldown_s": "30"}, 422, "default_retry_cooldown_s"),
        ({"default_time_limit_s": 0}, 400, "default_time_limit_s must be a whole number from 1"),
        ({"default_time_limit_s": 30 * 86400 + 1}, 400, "from 1 to 2592000"),
    ],
)
def test_bad_defaults_are_refused_with_a_sentence_and_change_nothing(
    admin_api, team, body, status, fragment
):
    assert_refused(patch(admin_api, "/teams/vision", body), status, fragment)
    team.refresh_from_db()
    assert (team.default_max_retries, team.default_retry_cooldown_s, team.window_id) == (
        0,
        30,
        None,
    )


def test_quotas_cannot_be_set_through_the_api(admin_api, team):
    response = patch(admin_api, "/teams/vision", {"gpu_quota": 100, "default_max_retries": 1})
    assert response.status_code == 200  # unknown fields are ignored by the schema
    team.refresh_from_db()
    assert team.gpu_quota == 8 and team.default_max_retries == 1
    assert "gpu_quota" not in str(admin_api.get("/teams/vision").json()["defaults"])


# -- the console ---------------------------------------------------------------------------------


def test_the_teams_page_lists_my_teams_with_my_role(alice, make_team):
    make_team("nlp")
    page = signed_in(alice).get("/teams/").content.decode()
    assert 'href="/teams/vision/"' in page and "nlp" not in page
    assert ">member<" in page and "Teams</a>" in page


def test_a_members_team_page_shows_members_quotas_defaults_and_no_forms(alice, admin):
    page = signed_in(alice).get("/teams/vision/").content.decode()
    for text in ("Team vision", "ada", "admin", "GPU quota", "Quotas are set by staff", "local"):
        assert text in page
    assert "Add member" not in page and "Save defaults" not in page


def test_an_admins_team_page_has_the_forms(admin):
    page = signed_in(admin).get("/teams/vision/").content.decode()
    assert "Add member" in page and "Save defaults" in page and "Change role" in page


def test_another_teams_page_is_404(alice, make_team):
    make_team("nlp")
    client = signed_in(alice)
    assert client.get("/teams/nlp/").status_code == 404
    assert client.post("/teams/nlp/members/", {"username": "alice"}).status_code == 404


def test_console_forms_need_csrf_and_manage_members(admin, team, carol):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)
    client.get("/teams/vision/")
    assert client.post("/teams/vision/members/", {"username": "carol"}).status_code == 403
    token = client.cookies["csrftoken"].value
    form = {"csrfmiddlewaretoken": token}
    added = client.post(
        "/teams/vision/members/", {**form, "username": "carol", "role": "viewer"}, follow=True
    )
    assert "carol added to team vision as viewer" in added.content.decode()
    client.post("/teams/vision/members/carol/role/", {**form, "role": "member"})
    assert roles(team)["carol"] == "member"
    client.post("/teams/vision/members/carol/remove/", form)
    assert "carol" not in roles(team)


def test_console_refusals_are_messages_on_the_team_page(admin, team):
    client = signed_in(admin)
    unknown = client.post("/teams/vision/members/", {"username": "ghost"}, follow=True)
    assert "unknown user &#x27;ghost&#x27;" in unknown.content.decode()
    last = client.post("/teams/vision/members/ada/remove/", follow=True)
    assert "ada is the last admin of team vision" in last.content.decode()
    assert roles(team)["ada"] == "admin"


def test_a_member_posting_a_console_form_gets_403(alice, team, carol):
    client = signed_in(alice)
    assert client.post("/teams/vision/members/", {"username": "carol"}).status_code == 403
    assert client.post("/teams/vision/members/alice/remove/").status_code == 403
    assert client.post("/teams/vision/defaults/", {"default_max_retries": "1"}).status_code == 403
    assert "carol" not in roles(team)


def test_console_defaults_form_saves_and_refuses_with_a_sentence(admin, team):
    client = signed_in(admin)
    form = {"default_cluster": "local", "window": "", "default_retry_cooldown_s": "60"}
    saved = client.post(
        "/teams/vision/defaults/", {**form, "default_max_retries": "4"}, follow=True
    )
    assert "defaults of team vision saved" in saved.content.decode()
    team.refresh_from_db()
    assert (team.default_max_retries, team.default_retry_cooldown_s) == (4, 60)
    bad = client.post(
        "/teams/vision/defaults/", {**form, "default_max_retries": "lots"}, follow=True
    )
    assert "default_max_retries must be a whole number" in bad.content.decode()
    team.refresh_from_db()
    assert team.default_max_retries == 4


def test_removing_yourself_leads_back_to_the_teams_list(admin, make_user, team):
    make_user("eve", team, role="admin")
    response = signed_in(admin).post("/teams/vision/members/ada/remove/")
    assert response.url == "/teams/"


def test_staff_see_any_team_page_with_the_admin_link_for_quotas(make_user, make_team):
    nlp = make_team("nlp")
    staff = make_user("root")
    staff.is_staff = True
    staff.save()
    page = signed_in(staff).get("/teams/nlp/").content.decode()
    assert "staff (not a member)" in page and "Add member" in page
    assert f"/admin/jobs/team/{nlp.pk}/change/" in page
