"""Preemption keeps one flag: `Attempt.preempted_at` (the notice). `Job.paused_by_preemption`
said the same thing twice and goes.

A job a preemption paused now reads as such from the ledger itself (`jobs.reads.preemption`):
PAUSED with the preemption's reason, its current attempt bearing the notice. Every row the old
flag marked already was so (the reconciler set the flag in the transaction that wrote that
reason, and each clearing of it moved the job off PAUSED); the upgrade makes sure of it, so no
job a preemption paused is left unqueued. Going back sets the flag where the rule holds.
"""

from django.db import migrations
from django.db.models import F
from django.db.models.functions import Coalesce

# `jobs.reads.preemption.PAUSED_REASON` as this migration was written.
PAUSED_REASON = "preempted: borrowed GPUs returned to the lending team"


def keep_what_the_flag_said(apps, schema_editor) -> None:
    job_model = apps.get_model("jobs", "Job")
    attempt_model = apps.get_model("jobs", "Attempt")
    flagged = job_model.objects.filter(status="PAUSED", paused_by_preemption=True)
    attempt_model.objects.filter(
        pk__in=flagged.values("current_attempt"), preempted_at__isnull=True
    ).update(preempted_at=Coalesce(F("end_time"), F("submitted_at")))
    flagged.exclude(status_reason=PAUSED_REASON).update(status_reason=PAUSED_REASON)


def flag_what_the_rule_says(apps, schema_editor) -> None:
    job_model = apps.get_model("jobs", "Job")
    job_model.objects.filter(
        status="PAUSED",
        status_reason=PAUSED_REASON,
        current_attempt__preempted_at__isnull=False,
    ).update(paused_by_preemption=True)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0030_cluster_grants"),
    ]

    operations = [
        migrations.RunPython(keep_what_the_flag_said, flag_what_the_rule_says),
        migrations.RemoveField(model_name="job", name="paused_by_preemption"),
    ]
