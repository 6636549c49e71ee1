"""Issue 50: engine's own start and end on each attempt."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0033_tracking_values"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="engine_start",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="attempt",
            name="engine_end",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
