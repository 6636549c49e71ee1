"""Issue 50: GPU prices and money budgets."""

import django.core.validators
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

import jobs.money


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0035_activity_policies"),
    ]

    operations = [
        migrations.AddField(
            model_name="team",
            name="budget_alert_percents",
            field=models.CharField(
                blank=True,
                default="50,80,100",
                help_text="percents of the money budget at which the team's webhooks are told, "
                "each once a month, e.g. 50,80,100; empty: none",
                max_length=100,
                validators=[jobs.money.validate_alert_percents],
            ),
        ),
        migrations.AddField(
            model_name="team",
            name="money_budget_per_month",
            field=models.DecimalField(
                blank=True,
                decimal_places=2,
                help_text="monthly budget in the server's currency (UTC calendar month), at the "
                "GPU prices in force; when used up new jobs wait; empty: none",
                max_digits=14,
                null=True,
                validators=[django.core.validators.MinValueValidator(0)],
            ),
        ),
        migrations.AlterField(
            model_name="team",
            name="budget_hard_stop",
            field=models.BooleanField(
                default=False,
                help_text="when the monthly budget (GPU-hours or money) is used up, also stop "
                "the team's running jobs",
            ),
        ),
        migrations.CreateModel(
            name="BudgetAlert",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("month", models.DateField()),
                ("percent", models.PositiveIntegerField()),
                (
                    "used_micros",
                    models.BigIntegerField(help_text="the month's cost when it was reached"),
                ),
                ("budget_micros", models.BigIntegerField()),
                ("notified_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "team",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="jobs.team",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("team", "month", "percent"), name="one_alert_per_threshold"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="GpuPrice",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "gpu_type",
                    models.CharField(
                        blank=True,
                        help_text="e.g. H100; empty: the cluster's default price",
                        max_length=64,
                    ),
                ),
                (
                    "per_gpu_hour",
                    models.DecimalField(
                        decimal_places=6,
                        help_text="price of one GPU for one hour, in the server's currency "
                        "(SF_CURRENCY)",
                        max_digits=14,
                        validators=[django.core.validators.MinValueValidator(0)],
                    ),
                ),
                (
                    "valid_from",
                    models.DateTimeField(
                        default=django.utils.timezone.now,
                        help_text="in force from this moment until the next price",
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(default=django.utils.timezone.now, editable=False),
                ),
                (
                    "cluster",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="prices",
                        to="jobs.cluster",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("cluster", "gpu_type", "valid_from"), name="one_price_per_moment"
                    )
                ],
            },
        ),
    ]
