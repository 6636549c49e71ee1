"""Issue 50: activity, idle and hang policies."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0034_engine_times"),
    ]

    operations: list = []
