"""Issue 50: cost in usage."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0003_activity"),
    ]

    operations: list = []
