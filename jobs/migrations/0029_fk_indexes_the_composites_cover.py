"""Drop the single-column indexes of six foreign keys whose composite indexes lead with them.

Only the indexes go: SeparateDatabaseAndState, because AlterField would drop and re-add each
foreign key constraint on PostgreSQL (checking every row again) and rebuild jobs_job four times
on SQLite. The names are those Django gave the indexes, the same on both databases.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# (index, table, column, the composite index that leads with the column and serves its lookups)
INDEXES = [
    ("jobs_attempt_job_id_b587cf59", "jobs_attempt", "job_id", "one_attempt_number"),
    ("jobs_job_array_id_c2e16258", "jobs_job", "array_id", "job_array_status"),
    ("jobs_job_cluster_id_e533c240", "jobs_job", "cluster_id", "job_cluster_status"),
    ("jobs_job_team_id_c38d3640", "jobs_job", "team_id", "job_team_status"),
    ("jobs_job_user_id_093659ab", "jobs_job", "user_id", "job_user_latest"),
    ("jobs_jobevent_job_id_79067df7", "jobs_jobevent", "job_id", "event_job_order"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0028_attempt_started_unmetered_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{name}"',
                    reverse_sql=f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ("{column}")',
                )
                for name, table, column, _ in INDEXES
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="job",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attempts",
                        to="jobs.job",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="array",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="tasks",
                        to="jobs.jobarray",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="cluster",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        to="jobs.cluster",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="team",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="jobs",
                        to="jobs.team",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="user",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="jobevent",
                    name="job",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="jobs.job",
                    ),
                ),
            ],
        ),
    ]
