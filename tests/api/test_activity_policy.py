"""A team's idle and hang policy and a job's idle exemption through the API: team admins and
staff set them, members read them and get 403 when they try to lift them."""

import pytest

from jobs.models import ActivityPolicy, IdleExemption, JobEvent
from tests.factories import queued_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(make_user, team):
    return make_user("ada", team, role="admin")


def patch(api, path: str, body: dict):
    return api.client.patch(f"/api/v1{path}", body, content_type="application/json")


def test_a_team_admin_sets_the_policy_and_members_read_it(api_as, admin, alice, team):
    answer = patch(
        api_as(admin), "/teams/vision/activity-policy",
        {"idle_after_s": 1800, "idle_action": "stop", "hang_after_s": 900, "hang_action": "fail"},
    )  # fmt: skip
    assert answer.status_code == 200, answer.content
    policy = ActivityPolicy.objects.get(team=team)
    assert (policy.idle_after_s, policy.idle_grace_s, policy.idle_action) == (1800, 600, "stop")
    assert (policy.hang_after_s, policy.hang_action) == (900, "fail")
    read = api_as(alice).get("/teams/vision/activity-policy").json()
    assert read == {
        "idle_after_s": 1800, "idle_grace_s": 600, "idle_action": "stop",
        "hang_after_s": 900, "hang_action": "fail",
    }  # fmt: skip


def test_a_member_cannot_lift_the_policy(api_as, admin, alice, team):
    ActivityPolicy.objects.create(team=team, idle_after_s=600)
    answer = patch(api_as(alice), "/teams/vision/activity-policy", {"idle_after_s": None})
    assert answer.status_code == 403
    assert "only team admins" in answer.json()["detail"]
    assert ActivityPolicy.objects.get(team=team).idle_after_s == 600


def test_null_turns_a_policy_off_and_bad_values_get_a_sentence(api_as, admin, team):
    ActivityPolicy.objects.create(team=team, idle_after_s=600)
    assert (
        patch(api_as(admin), "/teams/vision/activity-policy", {"idle_after_s": None}).status_code
        == 200
    )
    assert ActivityPolicy.objects.get(team=team).idle_after_s is None
    bad = patch(api_as(admin), "/teams/vision/activity-policy", {"idle_grace_s": 0})
    assert bad.status_code == 400 and "from 1 to" in bad.json()["detail"]
    bad = patch(api_as(admin), "/teams/vision/activity-policy", {"hang_action": "reboot"})
    assert bad.status_code == 422


def test_only_a_team_admin_exempts_a_job_and_the_job_says_who(api_as, admin, alice, team):
    job = queued_job(team, alice)
    refused = api_as(alice).post(f"/jobs/{job.pk}/idle-exemption", {"reason": "mine"})
    assert refused.status_code == 403 and not IdleExemption.objects.exists()
    answer = api_as(admin).post(f"/jobs/{job.pk}/idle-exemption", {"reason": "a notebook"})
    assert answer.status_code == 200, answer.content
    assert answer.json()["by"] == "ada"
    assert JobEvent.objects.filter(job=job, reason__contains="exempted").exists()
    lifted = api_as(admin).client.delete(f"/api/v1/jobs/{job.pk}/idle-exemption")
    assert lifted.status_code == 204 and not IdleExemption.objects.exists()
