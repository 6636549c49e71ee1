from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0017_metric_ingest"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="launch_claimed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
