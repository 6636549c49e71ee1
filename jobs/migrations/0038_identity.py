"""Issue 51: identities from an OpenID provider and SCIM."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

import jobs.identities


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0037_audit"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Identity",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "scim_id",
                    models.CharField(
                        default=jobs.identities.new_scim_id, max_length=36, unique=True
                    ),
                ),
                ("external_id", models.CharField(blank=True, default="", max_length=255)),
                (
                    "oidc_subject",
                    models.CharField(blank=True, max_length=255, null=True, unique=True),
                ),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="identity",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="GroupLink",
            fields=[
                (
                    "team",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="group_link",
                        serialize=False,
                        to="jobs.team",
                    ),
                ),
                ("external_id", models.CharField(blank=True, default="", max_length=255)),
            ],
        ),
    ]
