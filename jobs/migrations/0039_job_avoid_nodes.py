"""Issue 50: the nodes a job's hung attempts ran on, which its later attempts keep off."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0038_identity"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="avoid_nodes",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
