"""Issue 50: usage by GPU type. Existing records keep their usage as typeless ("").

Going back merges each day, team, user and cluster's types into one typeless record again.
"""

from django.db import migrations, models

FIGURES = (
    "gpu_us",
    "deleted_gpu_us",
    "borrowed_gpu_us",
    "cost_micros",
    "active_gpu_us",
    "idle_gpu_us",
)


def merge_types(apps, schema_editor):
    record = apps.get_model("metering", "UsageRecord")
    typed = record.objects.exclude(gpu_type="").order_by("pk")
    for row in typed.iterator(chunk_size=1000):
        into, _ = record.objects.get_or_create(
            day=row.day, team_id=row.team_id, user_id=row.user_id, cluster_id=row.cluster_id,
            gpu_type="",
        )  # fmt: skip
        for name in FIGURES:
            setattr(into, name, getattr(into, name) + getattr(row, name))
        into.save(update_fields=FIGURES)
        row.delete()


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
        migrations.RunPython(migrations.RunPython.noop, merge_types),
    ]
