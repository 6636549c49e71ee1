"""The audit log's record API, its append-only model, the PostgreSQL trigger and the purge."""

import csv
import datetime as dt
import io

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.test import RequestFactory
from django.utils import timezone

from jobs import audit
from jobs.audited import AuditEntry, AuditImmutable

pytestmark = pytest.mark.django_db


def test_record_names_the_person_the_token_the_target_its_team_and_the_address(alice, team):
    from jobs.models import ApiToken

    token = ApiToken.objects.create(user=alice, name="ci", prefix="sf_abcd", key_hash="x" * 64)
    request = RequestFactory().post("/api/v1/teams/vision", REMOTE_ADDR="203.0.113.9")
    row = audit.record(
        alice, "team.defaults", team, {"max_jobs": 1}, {"max_jobs": 2}, request, token
    )
    row.refresh_from_db()
    assert (row.actor_id, row.actor, row.token_id, row.token) == (
        alice.pk,
        "alice",
        token.pk,
        "sf_abcd",
    )
    assert (row.action, row.target_type, row.target, row.team_id, row.team) == (
        "team.defaults",
        "team",
        "vision",
        team.pk,
        "vision",
    )
    assert (row.before, row.after, row.address, row.door) == (
        {"max_jobs": 1},
        {"max_jobs": 2},
        "203.0.113.9",
        "api",
    )


def test_the_address_is_the_one_behind_trusted_proxies(alice, team, settings):
    settings.SF_TRUSTED_PROXIES = ["10.0.0.0/8"]
    request = RequestFactory().post(
        "/teams/vision/defaults/",
        REMOTE_ADDR="10.1.2.3",
        HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.7",
    )
    row = audit.record(alice, "team.defaults", team, request=request)
    assert (row.address, row.door) == ("198.51.100.7", "console")


def test_a_row_cannot_be_changed_or_deleted_through_the_orm(alice, team):
    row = audit.record(alice, "team.defaults", team)
    row.action = "nothing"
    with pytest.raises(AuditImmutable):
        row.save()
    with pytest.raises(AuditImmutable):
        row.delete()
    with pytest.raises(AuditImmutable):
        AuditEntry.objects.filter(pk=row.pk).update(action="nothing")
    with pytest.raises(AuditImmutable):
        AuditEntry.objects.filter(pk=row.pk).delete()
    assert AuditEntry.objects.get(pk=row.pk).action == "team.defaults"


def _raw(sql: str, params: list) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
def test_postgresql_refuses_raw_update_and_delete(alice, team):
    row = audit.record(alice, "team.defaults", team)
    with pytest.raises(DatabaseError, match="append-only"):
        _raw("UPDATE jobs_auditentry SET action = 'x' WHERE id = %s", [row.pk])
    with pytest.raises(DatabaseError, match="append-only"):
        _raw("DELETE FROM jobs_auditentry WHERE id = %s", [row.pk])
    assert AuditEntry.objects.get(pk=row.pk).action == "team.defaults"


def test_the_purge_exports_then_removes_only_rows_past_the_retention(alice, team, tmp_path):
    now = timezone.now()
    old = audit.record(alice, "job.stop", team)
    _backdate(old.pk, now - dt.timedelta(days=400))
    kept = audit.record(alice, "job.pause", team)
    removed, path = audit.purge(now=now, days=365, out_dir=tmp_path)
    assert removed == 1
    assert list(AuditEntry.objects.values_list("pk", flat=True)) == [kept.pk]
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["id"], r["action"], r["actor"]) for r in rows] == [
        (str(old.pk), "job.stop", "alice")
    ]
    assert audit.purge(now=now, days=365, out_dir=tmp_path) == (0, "")


def _backdate(pk: int, when: dt.datetime) -> None:
    """Test setup only: the purge's own way past the trigger."""
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SET LOCAL {audit.PURGE_SETTING} = 'on'")
        row = AuditEntry.objects.get(pk=pk)
        cursor.execute("DELETE FROM jobs_auditentry WHERE id = %s", [pk])
        row.time = when
        row._state.adding = True
        row.save(force_insert=True)


def test_manage_py_audit_purge_reports_what_it_exported(alice, team, tmp_path, settings):
    from django.core.management import call_command

    settings.SF_AUDIT_RETENTION_DAYS = 30
    old = audit.record(alice, "job.stop", team)
    _backdate(old.pk, timezone.now() - dt.timedelta(days=31))
    out = io.StringIO()
    call_command("audit_purge", "--out", str(tmp_path), stdout=out)
    assert "1 audit row(s) exported to" in out.getvalue()
    assert not AuditEntry.objects.filter(pk=old.pk).exists()
    assert len(list(tmp_path.glob("audit-until-*.csv"))) == 1


def test_beat_purges_daily_through_the_task(alice, team, settings, tmp_path):
    from jobs.tasks import purge_audit

    assert settings.CELERY_BEAT_SCHEDULE["audit-purge"]["task"] == "jobs.tasks.purge_audit"
    settings.SF_VAR_DIR = tmp_path
    settings.SF_AUDIT_RETENTION_DAYS = 30
    old = audit.record(alice, "job.stop", team)
    _backdate(old.pk, timezone.now() - dt.timedelta(days=31))
    purge_audit()
    assert not AuditEntry.objects.filter(pk=old.pk).exists()
    assert len(list((tmp_path / "audit").glob("*.csv"))) == 1
