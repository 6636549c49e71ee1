"""Each door writes one audit row for a person's change: the API (the CLI's), the console, the
admin, sign-in and out; a job's own reports write none."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.audited import AuditEntry
from jobs.models import Job
from tests.factories import place, queued_job

pytestmark = pytest.mark.django_db


def _rows(**match):
    return list(AuditEntry.objects.filter(**match).order_by("id"))


def test_an_api_stop_names_the_person_the_token_and_the_status_change(api, alice, team):
    job = queued_job(team, alice)
    response = api.post(f"/jobs/{job.pk}/stop")
    assert response.status_code == 200, response.content
    (row,) = _rows(action="job.stop")
    assert (row.actor, row.door, row.target_type, row.target_id, row.team_id) == (
        "alice",
        "api",
        "job",
        str(job.pk),
        team.pk,
    )
    assert row.token and row.token_id is not None
    assert (row.before, row.after) == ({"status": "QUEUED"}, {"status": "STOPPED"})


def test_a_refused_change_writes_no_row(api, alice, team):
    job = place(queued_job(team, alice), "SUCCEEDED")
    assert api.post(f"/jobs/{job.pk}/stop").status_code == 409
    assert _rows() == []


def test_a_console_change_of_team_defaults_keeps_before_and_after(make_user, team):
    admin = make_user("ada", team, role="admin")
    client = Client()
    client.force_login(admin)
    response = client.post(
        f"/teams/{team.name}/defaults/",
        {"default_max_retries": "3", "default_retry_cooldown_s": "60"},
    )
    assert response.status_code == 302
    (row,) = _rows(action="team.defaults")
    assert (row.actor, row.door, row.team, row.address) == ("ada", "console", "vision", "127.0.0.1")
    assert row.after["default_max_retries"] == 3
    assert row.before["default_max_retries"] != 3


def test_a_console_refusal_on_its_page_writes_no_row(make_user, team):
    viewer = make_user("vic", team, role="member")
    client = Client()
    client.force_login(viewer)
    client.post(f"/teams/{team.name}/members/", {"username": "nobody", "role": "member"})
    assert _rows(action="team.member_add") == []


def test_an_admin_change_is_recorded_with_its_fields(team):
    staff = User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(staff)
    job_count = Job.objects.count()
    response = client.post(
        f"/admin/auth/user/{staff.pk}/change/",
        {
            "username": "root",
            "first_name": "Ro",
            "last_name": "",
            "email": "",
            "is_active": "on",
            "is_staff": "on",
            "is_superuser": "on",
            "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00",
            "initial-date_joined_0": "2026-01-01",
            "initial-date_joined_1": "00:00:00",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    (row,) = _rows(action="admin.user.change")
    assert (row.actor, row.door, row.target_id) == ("root", "admin", str(staff.pk))
    assert row.after["first_name"] == "Ro" and row.before["first_name"] == ""
    assert "password" not in row.after
    assert Job.objects.count() == job_count


def test_sign_in_its_failure_and_sign_out_are_recorded(alice):
    client = Client()
    assert client.post("/accounts/login/", {"username": "alice", "password": "no"}).status_code
    assert client.post("/accounts/login/", {"username": "alice", "password": "pw"}).status_code
    client.post("/accounts/logout/")
    actions = [(r.action, r.actor) for r in _rows()]
    assert actions == [
        ("user.sign_in_failed", "alice"),
        ("user.sign_in", "alice"),
        ("user.sign_out", "alice"),
    ]


def test_a_scim_change_that_records_nothing_itself_is_recorded_as_the_provisioning_client():
    from django.contrib.auth.models import AnonymousUser
    from django.http import HttpResponse
    from django.test import RequestFactory

    from jobs.audit_http import AuditTrail

    request = RequestFactory().post("/scim/v2/Users", REMOTE_ADDR="192.0.2.4")
    request.user = AnonymousUser()
    trail = AuditTrail(lambda r: (trail.process_view(r, None, (), {}), HttpResponse(status=201))[1])
    assert trail(request).status_code == 201
    (row,) = _rows()
    assert (row.actor, row.action, row.door, row.address) == (
        "scim",
        "scim.users.post",
        "scim",
        "192.0.2.4",
    )
