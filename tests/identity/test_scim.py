"""Issue 51, point 2: SCIM 2.0 provisioning under /scim/v2/. Users are created, changed and
deactivated, teams kept as groups with their members; a deactivation or a removal from a group
stops the person's waiting work as every other door does; only the provisioning token gets in,
and SCIM never sees, makes or changes staff."""

import pytest
from django.contrib.auth.models import User

from jobs.actions.tokens import issue_token
from jobs.models import ApiToken, Identity, Job, Membership, Team
from jobs.states import JobStatus as S
from tests.factories import queued_job
from tests.identity.scim_calls import SCIM_TOKEN, ScimClient, patch, user_body

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _scim_on(settings):
    settings.SF_SCIM_TOKEN = SCIM_TOKEN


@pytest.fixture
def scim() -> ScimClient:
    return ScimClient()


def _create(scim: ScimClient, username: str, **fields) -> dict:
    answer = scim.send("POST", "Users", user_body(username, **fields))
    assert answer.status_code == 201, answer.content
    return answer.json()


def test_a_user_is_created_read_changed_and_listed(scim):
    made = _create(scim, "grace", externalId="okta-00g1")
    user = User.objects.get(username="grace")
    assert made["id"] == user.identity.scim_id and made["externalId"] == "okta-00g1"
    assert not user.has_usable_password() and user.email == "grace@example.org"

    changed = scim.send("PUT", f"Users/{made['id']}", user_body("grace", name={"givenName": "G"}))
    assert changed.status_code == 200 and changed.json()["name"]["givenName"] == "G"
    listed = scim.get("Users", filter='userName eq "grace"').json()
    assert [r["id"] for r in listed["Resources"]] == [made["id"]]


def test_a_taken_user_name_is_a_409(scim, make_user):
    make_user("bob")
    answer = scim.send("POST", "Users", user_body("bob"))
    assert answer.status_code == 409 and "exists already" in answer.json()["detail"]
    assert not Identity.objects.filter(user__username="bob").exists()


def test_deactivating_through_scim_stops_queued_jobs_and_revokes_tokens(scim, team):
    made = _create(scim, "grace")
    grace = User.objects.get(username="grace")
    group = scim.send(
        "PATCH",
        f"Groups/{team.pk}",
        patch({"op": "add", "path": "members", "value": [{"value": made["id"]}]}),
    )
    assert group.status_code == 200, group.content
    assert Membership.objects.get(team=team, user=grace).role == "member"
    job = queued_job(team, grace)
    issue_token(grace)

    answer = scim.send(
        "PATCH", f"Users/{made['id']}", patch({"op": "replace", "path": "active", "value": False})
    )

    assert answer.status_code == 200 and answer.json()["active"] is False
    job.refresh_from_db()
    assert job.status == S.STOPPED
    assert "deactivated" in job.events.order_by("-pk").first().reason
    assert not ApiToken.objects.filter(user=grace, revoked_at__isnull=True).exists()


def test_a_scim_delete_deactivates_and_unlinks(scim, team):
    made = _create(scim, "grace")
    grace = User.objects.get(username="grace")
    Membership.objects.create(team=team, user=grace)
    job = queued_job(team, grace)

    assert scim.delete(f"Users/{made['id']}").status_code == 204

    grace.refresh_from_db()
    job.refresh_from_db()
    assert not grace.is_active and job.status == S.STOPPED
    assert scim.get(f"Users/{made['id']}").status_code == 404


def test_removal_from_a_group_stops_the_persons_waiting_work_there(scim, team):
    made = _create(scim, "grace")
    scim.send(
        "PUT", f"Groups/{team.pk}", {"displayName": team.name, "members": [{"value": made["id"]}]}
    )
    grace = User.objects.get(username="grace")
    job = queued_job(team, grace)

    answer = scim.send(
        "PATCH",
        f"Groups/{team.pk}",
        patch({"op": "remove", "path": f'members[value eq "{made["id"]}"]'}),
    )

    assert answer.status_code == 200 and answer.json()["members"] == []
    assert not Membership.objects.filter(team=team, user=grace).exists()
    job.refresh_from_db()
    assert job.status == S.STOPPED and grace.is_active


def test_a_group_is_a_team_and_its_members_only_the_idps(scim, make_user):
    made = _create(scim, "grace")
    answer = scim.send(
        "POST",
        "Groups",
        {"displayName": "speech", "externalId": "grp-9", "members": [{"value": made["id"]}]},
    )
    assert answer.status_code == 201, answer.content
    speech = Team.objects.get(name="speech")
    local = make_user("local", speech)  # made in the admin: not the IdP's to list or remove
    body = answer.json()
    assert body["id"] == str(speech.pk) and body["externalId"] == "grp-9"
    assert [m["value"] for m in body["members"]] == [made["id"]]

    scim.send("PUT", f"Groups/{speech.pk}", {"displayName": "speech", "members": []})
    assert list(speech.membership_set.values_list("user__username", flat=True)) == [local.username]


def test_a_group_with_jobs_is_kept(scim, team, alice):
    queued_job(team, alice)
    answer = scim.delete(f"Groups/{team.pk}")
    assert answer.status_code == 409 and "has jobs" in answer.json()["detail"]
    assert Team.objects.filter(pk=team.pk).exists()


@pytest.mark.parametrize("key", ["nope", "0", "9" * 40, "%00", "1e9"])
def test_an_id_that_is_no_resource_is_a_404(scim, key):
    assert scim.get(f"Users/{key}").status_code == 404
    assert scim.get(f"Groups/{key}").status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        user_body(""),
        user_body("x" * 151),
        user_body("nul\x00name"),
        user_body("grace", emails="not-a-list"),
        user_body("grace", emails=[{"value": "not an address"}]),
        user_body("grace", active="yes"),
        user_body("grace", name="Grace"),
    ],
)
def test_a_bad_user_body_is_a_400_with_a_sentence(scim, body):
    answer = scim.send("POST", "Users", body)
    assert answer.status_code == 400 and answer.json()["detail"]
    assert not Job.objects.exists() and not Identity.objects.exists()


def test_bad_patches_are_400s(scim):
    made = _create(scim, "grace")
    for operations in (
        [],
        [{"op": "move", "path": "active", "value": False}],
        [{"op": "replace", "path": "isStaff", "value": True}],
        [{"op": "remove"}],
        ["replace"],
    ):
        answer = scim.send("PATCH", f"Users/{made['id']}", patch(*operations))
        assert answer.status_code == 400, (operations, answer.content)
    assert User.objects.get(username="grace").is_staff is False
