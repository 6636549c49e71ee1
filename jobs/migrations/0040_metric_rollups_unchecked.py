"""Issue 49: a metric rollup's job is neither indexed on its own (the bucket's unique
constraint leads with it) nor checked by the database at commit (a batch's hundred buckets
each checked against the job row were a fifth of an MLflow `log_batch`); see
`jobs.streamed.MetricRollup.job` for why the rows still cannot outlive their job."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0039_job_avoid_nodes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="metricrollup",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="metric_rollups",
                to="jobs.job",
            ),
        ),
    ]
