"""Point 4: a job's page names the person behind each change made by hand (stop, pause, resume,
retry, an array's verbs), as the audit log does; the system's events stay the system's."""

import pytest
from django.test import Client

from tests.factories import queued_job

pytestmark = pytest.mark.django_db


def test_the_job_page_names_who_paused_and_resumed_it(api, alice, team, make_user):
    job = queued_job(team, alice)
    assert api.post(f"/jobs/{job.pk}/pause").status_code == 200
    assert api.post(f"/jobs/{job.pk}/resume").status_code == 200
    viewer = make_user("vera", team, role="viewer")
    client = Client()
    client.force_login(viewer)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    people = page.split("Changes by people", 1)[1].split("Timeline", 1)[0]
    assert people.count("<strong>alice</strong>") == 2
    assert "job.pause" in people and "job.resume" in people
    timeline = page.split("<h2>Timeline</h2>", 1)[1]
    assert timeline.count("<strong") == 2 and timeline.count("(person)") == 2
    assert "127.0.0.1" not in people, "a viewer does not read the audit log's addresses"


def test_a_team_admin_sees_the_token_and_address_too(api, alice, team, make_user):
    job = queued_job(team, alice)
    api.post(f"/jobs/{job.pk}/stop")
    ada = make_user("ada", team, role="admin")
    client = Client()
    client.force_login(ada)
    people = client.get(f"/jobs/{job.pk}/").content.decode().split("Changes by people", 1)[1]
    assert "127.0.0.1" in people and "…" in people
