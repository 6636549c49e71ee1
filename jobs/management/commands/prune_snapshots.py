"""`manage.py prune_snapshots --older-than DAYS`: free the store of old, finished snapshots.

A snapshot is pruned when every job that references it ended (SUCCEEDED, FAILED or STOPPED, no
automatic retry pending) more than DAYS ago. The row stays with the reason, so a later retry
of such a job says why it cannot run.
"""

import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q
from django.utils import timezone

from jobs.models import Job, Snapshot
from jobs.snapshots import snapshot_path
from jobs.states import JobStatus

DONE = [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED]


class Command(BaseCommand):
    help = "Delete snapshot blobs whose jobs all ended more than --older-than days ago."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--older-than", type=int, required=True, metavar="DAYS")

    def handle(self, *args, older_than: int, **options) -> None:
        if older_than < 0:
            raise CommandError("--older-than must be a number of days >= 0")
        now = timezone.now()
        cutoff = now - dt.timedelta(days=older_than)
        still_needed = Job.objects.filter(
            Q(status_changed_at__gt=cutoff) | ~Q(status__in=DONE) | Q(next_attempt_at__isnull=False)
        ).values("snapshot_id")
        prunable = Snapshot.objects.filter(deleted_at__isnull=True).exclude(pk__in=still_needed)
        reason = f"with `prune_snapshots --older-than {older_than}` on {now:%Y-%m-%d}"
        count = 0
        for snapshot in prunable:
            snapshot_path(snapshot.sha256).unlink(missing_ok=True)
            Snapshot.objects.filter(pk=snapshot.pk).update(deleted_at=now, deleted_reason=reason)
            count += 1
        self.stdout.write(f"pruned {count} snapshot(s)")
