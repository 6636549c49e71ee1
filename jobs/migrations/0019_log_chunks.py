import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Logs in object storage: an attempt's batches as chunks until compacted into objects."""

    dependencies = [
        ("jobs", "0018_launch_claim"),
    ]

    operations = [
        migrations.CreateModel(
            name="LogChunk",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("start", models.BigIntegerField()),
                ("length", models.BigIntegerField()),
                ("data", models.BinaryField(null=True)),
                (
                    "stream",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="chunks",
                        to="jobs.logstream",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("stream", "start"), name="one_chunk_per_offset")
                ],
            },
        ),
    ]
