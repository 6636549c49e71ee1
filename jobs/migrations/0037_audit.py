"""Issue 51: the append-only audit log."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0036_prices_budgets"),
    ]

    operations: list = []
