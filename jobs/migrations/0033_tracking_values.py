"""MLflow params and tags per attempt (`TrackingValue`): what a job's code logs through
Starforge's MLflow endpoint besides metrics (issue 49, point 1). A new table: no row of the
ledger is touched."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0032_total_gpus"),
    ]

    operations = [
        migrations.CreateModel(
            name="TrackingValue",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("attempt", models.PositiveIntegerField()),
                (
                    "kind",
                    models.CharField(choices=[("param", "Param"), ("tag", "Tag")], max_length=5),
                ),
                ("key", models.CharField(max_length=250)),
                ("value", models.TextField()),
                (
                    "job",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="tracking_values",
                        to="jobs.job",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job", "attempt", "kind", "key"), name="one_tracking_value"
                    )
                ],
            },
        ),
    ]
