"""Who reads which audit rows: staff all, a team admin their teams', others none; filters,
pages and the CSV; another team's rows are a 404 (tests/hostile has the member's attempts)."""

import csv
import io

import pytest
from django.contrib.auth.models import User

from jobs import audit
from jobs.audit import Target

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows(make_team, make_user, team):
    other = make_team("nlp")
    ada = make_user("ada", team, role="admin")
    made = [
        audit.record(ada, "job.stop", Target("job", "1", "job 1", team.pk, team.name)),
        audit.record(ada, "team.defaults", team, {"max_jobs": 1}, {"max_jobs": 2}),
        audit.record(ada, "job.stop", Target("job", "2", "job 2", other.pk, other.name)),
        audit.record(ada, "token.create", Target("token", "5", "cli (sf_x…)")),
    ]
    return ada, other, made


def test_a_team_admin_reads_only_their_teams_rows_newest_first(api_as, rows):
    ada, _, made = rows
    body = api_as(ada).get("/audit").json()
    assert [i["id"] for i in body["items"]] == [made[1].pk, made[0].pk]
    assert body["items"][0]["before"] == {"max_jobs": 1}


def test_staff_read_every_row_and_filter_them(api_as, rows):
    _, _, made = rows
    staff = User.objects.create_user("root", password="pw", is_staff=True)
    api = api_as(staff)
    assert len(api.get("/audit").json()["items"]) == 4
    stops = api.get("/audit", action="job.stop").json()["items"]
    assert [i["id"] for i in stops] == [made[2].pk, made[0].pk]
    assert [i["id"] for i in api.get("/audit", action="job.").json()["items"]] == [
        made[2].pk,
        made[0].pk,
    ]
    assert [i["id"] for i in api.get("/audit", target="job:2").json()["items"]] == [made[2].pk]
    assert [i["id"] for i in api.get("/audit", team="nlp").json()["items"]] == [made[2].pk]
    assert api.get("/audit", actor="nobody").json()["items"] == []


def test_pages_follow_next_before(api_as, rows):
    _, _, made = rows
    staff = User.objects.create_user("root", password="pw", is_staff=True)
    api = api_as(staff)
    first = api.get("/audit", limit=3).json()
    assert len(first["items"]) == 3 and first["next_before"] == made[1].pk
    rest = api.get("/audit", limit=3, before=first["next_before"]).json()
    assert [i["id"] for i in rest["items"]] == [made[0].pk] and rest["next_before"] is None


def test_the_csv_has_every_matching_row_of_the_reader(api_as, rows):
    ada, _, made = rows
    response = api_as(ada).client.get("/api/v1/audit.csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    text = b"".join(response.streaming_content).decode()
    got = list(csv.DictReader(io.StringIO(text)))
    assert [r["id"] for r in got] == [str(made[0].pk), str(made[1].pk)]


def test_a_member_who_administers_nothing_reads_nothing(api_as, rows, alice):
    assert api_as(alice).get("/audit").json() == {"items": [], "next_before": None}


def test_the_console_page_lists_and_exports_what_the_admin_reads(client, rows):
    ada, _, made = rows
    client.force_login(ada)
    page = client.get("/audit/", {"action": "job."})
    assert page.status_code == 200
    assert b"job 1" in page.content and b"job 2" not in page.content
    assert client.get("/audit/", {"team": "nlp"}).status_code == 404
    assert client.get("/audit/", {"since": "yesterday"}).status_code == 400
    export = client.get("/audit/", {"format": "csv", "team": "vision"})
    text = b"".join(export.streaming_content).decode()
    assert [r["id"] for r in csv.DictReader(io.StringIO(text))] == [
        str(made[0].pk),
        str(made[1].pk),
    ]
