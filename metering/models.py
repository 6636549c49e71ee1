"""Usage records: GPU-microseconds per (UTC day, team, user, cluster, GPU type), from ended
attempts.

An attempt is added exactly once, when it has ended, in the transaction that sets its
`metered` flag (`metering.records.meter_ended`). Running and just-ended attempts are not in
the records yet; every usage answer adds them as it reads (`metering.records.usage_rows`).
Integers, so the records agree exactly with the attempts they came from.
"""

from django.conf import settings
from django.db import models

from jobs.models import Cluster, Team


class UsageRecord(models.Model):
    day = models.DateField()
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="usage_records")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT)
    # The GPU type the job asked for ("": any), the one its cost is priced by (metering.cost).
    gpu_type = models.CharField(max_length=64, blank=True, default="")
    gpu_us = models.BigIntegerField(default=0, help_text="GPU-microseconds of running time")
    # The part of gpu_us whose attempts were deleted with their job: still billed, no longer
    # checkable against attempts.
    deleted_gpu_us = models.BigIntegerField(default=0)
    # The part of gpu_us that ran on GPUs borrowed from another team's idle quota.
    borrowed_gpu_us = models.BigIntegerField(default=0)
    # What gpu_us cost, in millionths of the server's currency, at the prices in force when
    # each attempt ran (metering.cost).
    cost_micros = models.BigIntegerField(default=0)
    # The part of gpu_us whose GPUs worked, and the part they idled, by the runners' activity
    # reports (metering.activity; what was not reported is neither).
    active_gpu_us = models.BigIntegerField(default=0)
    idle_gpu_us = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "team", "user", "cluster", "gpu_type"], name="one_usage_record"
            ),
        ]
        indexes = [models.Index(fields=["team", "day"], name="usage_team_day")]

    def __str__(self) -> str:
        where = f"{self.team_id}/{self.user_id}/{self.cluster_id}/{self.gpu_type or 'any type'}"
        return f"{self.day} {where}: {self.gpu_us} GPU-µs"
