"""Issue 50: usage by GPU type. Existing records keep their usage as typeless ("")."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0004_cost"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagerecord",
            name="gpu_type",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.RemoveConstraint(model_name="usagerecord", name="one_usage_record"),
        migrations.AddConstraint(
            model_name="usagerecord",
            constraint=models.UniqueConstraint(
                fields=("day", "team", "user", "cluster", "gpu_type"), name="one_usage_record"
            ),
        ),
    ]
