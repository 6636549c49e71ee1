"""Issue 50: active and idle GPU-time in usage."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0002_borrowed_usage"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagerecord",
            name="active_gpu_us",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="usagerecord",
            name="idle_gpu_us",
            field=models.BigIntegerField(default=0),
        ),
    ]
