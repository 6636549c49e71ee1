"""Issue 50: active and idle GPU-time in usage."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0002_borrowed_usage"),
    ]

    operations: list = []
