"""Issue 50: cost in usage."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0003_activity"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagerecord",
            name="cost_micros",
            field=models.BigIntegerField(default=0),
        ),
    ]
