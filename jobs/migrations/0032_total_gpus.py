"""A job's and an attempt's GPU count in all is named for its unit: `gpus` becomes
`total_gpus` (nodes x GPUs per node, as before), so no field named `gpus` means one thing in the
ledger and another in a request. A column rename: no row is rewritten, on PostgreSQL or SQLite.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0031_preemption_one_flag"),
    ]

    operations = [
        migrations.RenameField(model_name="job", old_name="gpus", new_name="total_gpus"),
        migrations.RenameField(model_name="attempt", old_name="gpus", new_name="total_gpus"),
    ]
