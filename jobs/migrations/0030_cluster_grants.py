"""Cluster grants: a team may use only the clusters staff granted it (`jobs.grants`).

Existing installations keep working: each team is granted its default cluster and every
cluster it already has jobs on (whatever their state), so nothing queued, paused or awaiting
a retry loses its cluster, and what a team submitted to before it may submit to after.
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

GRANTED_BY = "upgrade: the team's default or a cluster it had jobs on"


def grant_what_teams_used(apps, schema_editor) -> None:
    team_model = apps.get_model("jobs", "Team")
    job_model = apps.get_model("jobs", "Job")
    grant_model = apps.get_model("jobs", "ClusterGrant")
    pairs = set(
        team_model.objects.filter(default_cluster__isnull=False).values_list(
            "pk", "default_cluster_id"
        )
    )
    pairs |= set(job_model.objects.values_list("team_id", "cluster_id").distinct())
    grant_model.objects.bulk_create(
        [grant_model(team_id=t, cluster_id=c, granted_by=GRANTED_BY) for t, c in sorted(pairs)],
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0029_fk_indexes_the_composites_cover"),
    ]

    operations = [
        migrations.CreateModel(
            name="ClusterGrant",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("granted_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "granted_by",
                    models.CharField(
                        blank=True,
                        help_text="empty: the team's default",
                        max_length=150,
                    ),
                ),
                (
                    "cluster",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="grants",
                        to="jobs.cluster",
                    ),
                ),
                (
                    "team",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="cluster_grants",
                        to="jobs.team",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("team", "cluster"), name="one_grant_per_team")
                ],
            },
        ),
        # Going back drops the table, grants and all: nothing to undo here.
        migrations.RunPython(grant_what_teams_used, migrations.RunPython.noop),
    ]
