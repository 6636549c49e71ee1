"""What the activity watch keeps: a team's idle and hang policy (`ActivityPolicy`), a job's
exemption from the idle policy (`IdleExemption`), and each attempt's activity as the runner
reported it (`AttemptActivity`: the rolled-up active and idle GPU-time, when it last moved,
the stacks it dumped, how far the policies went with it).

The figures are computed by metering alone (`metering.activity`, docs/ARCHITECTURE.md,
invariant 5); the policy's steps are decided by `jobs.loops.activity` and written by
`jobs.ledger.watch`. `jobs.models` imports these so the app and every reader find them there;
this module names the ledger's models by their labels and imports nothing of the ledger's.
"""

from django.conf import settings
from django.db import models


class ActivityPolicy(models.Model):
    """A team's idle and hang policy, set by staff (the admin) and the team's admins (the
    teams API, `sf team set`); a team without a row has neither (nothing watched)."""

    class IdleAction(models.TextChoices):
        PAUSE = "pause"  # paused after the checkpoint notice; a resume starts from it
        STOP = "stop"

    class HangAction(models.TextChoices):
        NOTIFY = "notify"  # the event and the notification only
        FAIL = "fail"  # failed with cause "hung", retried per the job's budget
        STOP = "stop"

    team = models.OneToOneField(
        "jobs.Team", on_delete=models.CASCADE, primary_key=True, related_name="activity_policy"
    )
    idle_after_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="warn a job idle this long (seconds); empty: never"
    )
    idle_grace_s = models.PositiveIntegerField(
        default=600, help_text="after the warning, this long (seconds) before the notice"
    )
    idle_action = models.CharField(
        max_length=8, choices=IdleAction.choices, default=IdleAction.PAUSE
    )
    hang_after_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="report a suspected hang when a rank made no progress and the job logged no "
        "metric this long (seconds); empty: never",
    )
    hang_action = models.CharField(
        max_length=8, choices=HangAction.choices, default=HangAction.NOTIFY
    )

    def __str__(self) -> str:
        return f"activity policy of team {self.team_id}"


class IdleExemption(models.Model):
    """A job the idle policy leaves alone, by a team admin's word (shown on the job)."""

    job = models.OneToOneField(
        "jobs.Job", on_delete=models.CASCADE, primary_key=True, related_name="idle_exemption"
    )
    by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField()
    reason = models.CharField(max_length=200, blank=True)


class AttemptActivity(models.Model):
    """One attempt's activity, kept by the runner's reports (`metering.activity.observe`, one
    row update per report) and the watch's steps. Times are the server's clock."""

    attempt = models.OneToOneField(
        "jobs.Attempt", on_delete=models.CASCADE, primary_key=True, related_name="activity"
    )
    reported_at = models.DateTimeField(null=True, blank=True)  # the last report
    reports = models.PositiveIntegerField(default=0)
    active_gpu_us = models.BigIntegerField(default=0)
    idle_gpu_us = models.BigIntegerField(default=0)
    busy_at = models.DateTimeField(null=True, blank=True)  # a report last showed work
    moved_at = models.DateTimeField(null=True, blank=True)  # a report last showed progress
    stepped_at = models.DateTimeField(null=True, blank=True)  # the job last logged a metric
    ranks_moved = models.JSONField(default=dict, blank=True)  # rank -> epoch s it last moved
    dumps = models.JSONField(default=list, blank=True)  # [{rank, text}], bounded
    dumps_at = models.DateTimeField(null=True, blank=True)
    idle_warned_at = models.DateTimeField(null=True, blank=True)
    idle_noticed_at = models.DateTimeField(null=True, blank=True)
    hang_reported_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"activity of attempt {self.attempt_id}"
