"""The first console pages: sign-in, the jobs list and a job page, limited to the user's teams."""

import pytest
from django.test import Client

from tests.jobs.factories import queued_job

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_pages_need_a_signed_in_user():
    assert Client().get("/").url.startswith("/accounts/login/")
    assert Client().get("/accounts/login/").status_code == 200


def test_sign_in_with_password_reaches_the_jobs_list(alice):
    client = Client()
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw"})
    assert response.status_code == 302
    assert "Jobs" in client.get("/").content.decode()


def test_jobs_list_and_job_page_show_only_my_teams(team, alice, make_team, make_user):
    mine = queued_job(team, alice, name="my-run")
    other_team = make_team("nlp")
    theirs = queued_job(other_team, make_user("bob", other_team), name="their-run")
    client = signed_in(alice)
    page = client.get("/").content.decode()
    assert "my-run" in page and "their-run" not in page
    assert client.get(f"/jobs/{mine.pk}/").status_code == 200
    assert client.get(f"/jobs/{theirs.pk}/").status_code == 404
