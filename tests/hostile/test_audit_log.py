"""The audit log against its readers and its writers: a member or another team's admin never
reads a team's rows (404, never listed), and no door changes or deletes a row (the ORM, the
Django admin, raw SQL on PostgreSQL)."""

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.test import Client

from jobs import audit
from jobs.audit import Target
from jobs.audited import AuditEntry, AuditImmutable

pytestmark = pytest.mark.django_db


@pytest.fixture
def theirs(make_team, make_user):
    """A row of team nlp, made by its admin; returns it."""
    nlp = make_team("nlp")
    nina = make_user("nina", nlp, role="admin")
    return audit.record(nina, "job.stop", Target("job", "9", "job 9", nlp.pk, "nlp"))


@pytest.mark.parametrize("role", ["member", "admin"])
def test_another_teams_rows_are_404_and_never_listed(api_as, make_user, team, theirs, role):
    reader = api_as(make_user("eve", team, role=role))
    assert reader.get(f"/audit/{theirs.pk}").status_code == 404
    assert reader.get("/audit", team="nlp").status_code == 404
    assert reader.get("/audit", target=f"job:{theirs.target_id}").json()["items"] == []
    assert theirs.pk not in [i["id"] for i in reader.get("/audit").json()["items"]]
    export = reader.client.get("/api/v1/audit.csv")
    assert b"nlp" not in b"".join(export.streaming_content)
    console = Client()
    console.force_login(reader.user)
    assert console.get("/audit/", {"team": "nlp"}).status_code == 404
    assert b"job 9" not in console.get("/audit/").content


def test_a_member_does_not_read_their_own_teams_rows(api_as, make_user, team):
    ada = make_user("ada", team, role="admin")
    row = audit.record(ada, "team.defaults", team)
    member = api_as(make_user("mo", team))
    assert member.get(f"/audit/{row.pk}").status_code == 404
    assert member.get("/audit", team="vision").status_code == 404


def test_no_orm_path_changes_or_deletes_a_row(theirs):
    theirs.actor = "someone else"
    for attempt in (
        theirs.save,
        theirs.delete,
        lambda: AuditEntry.objects.filter(pk=theirs.pk).update(actor="x"),
        lambda: AuditEntry.objects.all().delete(),
        lambda: AuditEntry.objects.bulk_update([theirs], ["actor"]),
    ):
        with pytest.raises(AuditImmutable), transaction.atomic():
            attempt()
    assert AuditEntry.objects.get(pk=theirs.pk).actor == "nina"


def test_the_admin_offers_no_change_and_no_delete_even_to_a_superuser(theirs):
    root = User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(root)
    base = f"/admin/jobs/auditentry/{theirs.pk}"
    assert client.post(f"{base}/change/", {"actor": "x", "action": "y"}).status_code == 403
    assert client.post(f"{base}/delete/", {"post": "yes"}).status_code == 403
    client.post(
        "/admin/jobs/auditentry/",
        {"action": "delete_selected", "_selected_action": [theirs.pk], "post": "yes"},
    )
    assert AuditEntry.objects.get(pk=theirs.pk).actor == "nina"
    assert client.get("/admin/jobs/auditentry/add/").status_code == 403


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE jobs_auditentry SET actor = 'x' WHERE id = %s",
        "DELETE FROM jobs_auditentry WHERE id = %s",
        # the purge's variable set without LOCAL still only lets DELETE through, never UPDATE
        "SET starforge.audit_purge = 'on'; UPDATE jobs_auditentry SET actor = 'x' WHERE id = %s",
    ],
)
def test_raw_sql_cannot_change_or_delete_a_row_on_postgresql(theirs, sql):
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            for statement in sql.split("; "):
                cursor.execute(statement, [theirs.pk] if "%s" in statement else None)
    assert AuditEntry.objects.get(pk=theirs.pk).actor == "nina"
