"""Issue 50: engine's own start and end on each attempt."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0033_tracking_values"),
    ]

    operations: list = []
