"""`manage.py prune_snapshots --older-than DAYS`: free the store of old, finished snapshots.

A snapshot is pruned when every job that references it ended (SUCCEEDED, FAILED or STOPPED, no
automatic retry pending) more than DAYS ago, or, referenced by no job, it was uploaded more
than DAYS ago. Its blob goes, and with it every team's claim (so it no longer counts against
a team's snapshot quota); the row stays with the reason, so a later retry of such a job says
why it cannot run. Each snapshot is pruned under its row lock, the one submit takes, so a job
submitted meanwhile keeps its snapshot.
"""

import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from jobs.models import Job, Snapshot, SnapshotOwner
from jobs.states import JobStatus
from jobs.stores.snapshots import delete_blob

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
        reason = f"with `prune_snapshots --older-than {older_than}` on {now:%Y-%m-%d}"
        count = 0
        for sha in prunable(cutoff).values_list("pk", flat=True):
            with transaction.atomic():
                # Lock first, then look again in a statement of its own, which sees a submit
                # that committed while this waited for the lock.
                list(Snapshot.objects.select_for_update().filter(pk=sha).values_list("pk"))
                if not prunable(cutoff).filter(pk=sha).exists():
                    continue  # a job was submitted with it since the list was read
                delete_blob(sha)
                SnapshotOwner.objects.filter(snapshot_id=sha).delete()
                Snapshot.objects.filter(pk=sha).update(deleted_at=now, deleted_reason=reason)
            count += 1
        self.stdout.write(f"pruned {count} snapshot(s)")


def prunable(cutoff: dt.datetime):
    still_needed = (
        Job.objects.filter(
            Q(status_changed_at__gt=cutoff) | ~Q(status__in=DONE) | Q(next_attempt_at__isnull=False)
        )
        .filter(snapshot__isnull=False)
        .values("snapshot_id")
    )  # a NULL would make NOT IN empty
    used = Exists(Job.objects.filter(snapshot=OuterRef("pk")))
    return (
        Snapshot.objects.filter(deleted_at__isnull=True)
        .exclude(pk__in=still_needed)
        .filter(Q(used) | Q(created_at__lte=cutoff))
    )
