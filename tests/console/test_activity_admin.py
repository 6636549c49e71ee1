"""Staff set a team's idle and hang policy in the Django admin (an inline on the team) and see
a job's idle exemption (an inline on the job)."""

import pytest
from django.contrib.auth.models import User

from tests.factories import queued_job

pytestmark = pytest.mark.django_db


def test_the_team_and_job_pages_of_the_admin_hold_the_policy_and_the_exemption(client, team, alice):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    page = client.get(f"/admin/jobs/team/{team.pk}/change/")
    assert page.status_code == 200
    for field in ("idle_after_s", "idle_grace_s", "idle_action", "hang_after_s", "hang_action"):
        assert (
            f"activity_policy-0-{field}".encode() in page.content or field.encode() in page.content
        )
    job = queued_job(team, alice)
    page = client.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200 and b"idle_exemption" in page.content
