"""Issue 51: the append-only audit log (`jobs.audited.AuditEntry`).

On PostgreSQL a trigger refuses UPDATE and DELETE on its rows, whatever the client: the one
exception is a DELETE in a transaction that set `starforge.audit_purge` to 'on' (SET LOCAL),
which only the retention purge does (`jobs.audit.purge`, after exporting the rows). A session
variable stops the application's paths, not a database superuser: whoever holds the ledger's
owner role can drop the trigger. SQLite (the embedded default) has the model's refusals only.
"""

import django.utils.timezone
from django.db import migrations, models

FUNCTION = """
CREATE OR REPLACE FUNCTION jobs_audit_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('starforge.audit_purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit log is append-only: % of audit row % refused', TG_OP, OLD.id
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER jobs_audit_append_only
    BEFORE UPDATE OR DELETE ON jobs_auditentry
    FOR EACH ROW EXECUTE FUNCTION jobs_audit_append_only();
"""
DROP = """
DROP TRIGGER IF EXISTS jobs_audit_append_only ON jobs_auditentry;
DROP FUNCTION IF EXISTS jobs_audit_append_only();
"""


def _on_postgresql(sql: str):
    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(sql)  # no parameters: its '%' are RAISE's

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0036_prices_budgets"),
    ]

    operations = [
        migrations.CreateModel(
            name="AuditEntry",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "time",
                    models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                ),
                ("actor_id", models.IntegerField(blank=True, db_index=True, null=True)),
                ("actor", models.CharField(blank=True, max_length=150)),
                ("token_id", models.IntegerField(blank=True, null=True)),
                ("token", models.CharField(blank=True, max_length=16)),
                ("door", models.CharField(max_length=16)),
                ("action", models.CharField(db_index=True, max_length=64)),
                ("target_type", models.CharField(blank=True, max_length=32)),
                ("target_id", models.CharField(blank=True, max_length=64)),
                ("target", models.CharField(blank=True, max_length=200)),
                ("team_id", models.IntegerField(blank=True, db_index=True, null=True)),
                ("team", models.CharField(blank=True, max_length=50)),
                ("before", models.JSONField(blank=True, null=True)),
                ("after", models.JSONField(blank=True, null=True)),
                ("address", models.CharField(blank=True, max_length=64)),
            ],
            options={
                "verbose_name": "audit entry",
                "verbose_name_plural": "audit log",
                "indexes": [models.Index(fields=["team_id", "id"], name="audit_team_order")],
            },
        ),
        migrations.RunPython(_on_postgresql(FUNCTION), _on_postgresql(DROP)),
    ]
