import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Ingest throughput: log chunks in the ledger kept zlib-compressed (those already stored
    stay as they are, flagged so), and metric points without a foreign-key constraint in the
    database (the ORM still deletes them with their job)."""

    dependencies = [
        ("jobs", "0019_log_chunks"),
    ]

    operations = [
        migrations.AddField(
            model_name="logchunk",
            name="zlib",
            field=models.BooleanField(default=False),
        ),
        migrations.AlterField(
            model_name="metricpoint",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="metric_points",
                to="jobs.job",
            ),
        ),
    ]
