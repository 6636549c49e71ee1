import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Metric ingest: drop the points' index on job alone, which the (job, attempt, seq) and
    (job, kind, name, step) indexes already serve, so each stored point writes one index less."""

    dependencies = [
        ("jobs", "0016_team_gpu_type_quota"),
    ]

    operations = [
        migrations.AlterField(
            model_name="metricpoint",
            name="job",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="metric_points",
                to="jobs.job",
            ),
        ),
    ]
