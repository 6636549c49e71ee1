"""Issue 50: GPU prices and money budgets."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0035_activity_policies"),
    ]

    operations: list = []
