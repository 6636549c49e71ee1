"""Issue 50: activity, idle and hang policies (jobs.watched)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0034_engine_times"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ActivityPolicy",
            fields=[
                (
                    "team",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="activity_policy",
                        serialize=False,
                        to="jobs.team",
                    ),
                ),
                (
                    "idle_after_s",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="warn a job idle this long (seconds); empty: never",
                        null=True,
                    ),
                ),
                (
                    "idle_grace_s",
                    models.PositiveIntegerField(
                        default=600,
                        help_text="after the warning, this long (seconds) before the notice",
                    ),
                ),
                (
                    "idle_action",
                    models.CharField(
                        choices=[("pause", "Pause"), ("stop", "Stop")],
                        default="pause",
                        max_length=8,
                    ),
                ),
                (
                    "hang_after_s",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="report a suspected hang when a rank made no progress and the "
                        "job logged no metric this long (seconds); empty: never",
                        null=True,
                    ),
                ),
                (
                    "hang_action",
                    models.CharField(
                        choices=[("notify", "Notify"), ("fail", "Fail"), ("stop", "Stop")],
                        default="notify",
                        max_length=8,
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="AttemptActivity",
            fields=[
                (
                    "attempt",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="activity",
                        serialize=False,
                        to="jobs.attempt",
                    ),
                ),
                ("reported_at", models.DateTimeField(blank=True, null=True)),
                ("reports", models.PositiveIntegerField(default=0)),
                ("active_gpu_us", models.BigIntegerField(default=0)),
                ("idle_gpu_us", models.BigIntegerField(default=0)),
                ("busy_at", models.DateTimeField(blank=True, null=True)),
                ("moved_at", models.DateTimeField(blank=True, null=True)),
                ("stepped_at", models.DateTimeField(blank=True, null=True)),
                ("ranks_moved", models.JSONField(blank=True, default=dict)),
                ("dumps", models.JSONField(blank=True, default=list)),
                ("dumps_at", models.DateTimeField(blank=True, null=True)),
                ("idle_warned_at", models.DateTimeField(blank=True, null=True)),
                ("idle_noticed_at", models.DateTimeField(blank=True, null=True)),
                ("hang_reported_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name="IdleExemption",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="idle_exemption",
                        serialize=False,
                        to="jobs.job",
                    ),
                ),
                ("at", models.DateTimeField()),
                ("reason", models.CharField(blank=True, max_length=200)),
                (
                    "by",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
    ]
