import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0010_attempt_clocks_and_token_nonce"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="created_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="created_tokens",
                to="jobs.apitoken",
            ),
        ),
    ]
