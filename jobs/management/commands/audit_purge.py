"""`manage.py audit_purge`: export the audit rows older than SF_AUDIT_RETENTION_DAYS to a CSV
file, then remove them (`jobs.audit.purge`, the one path the append-only trigger lets through)."""

from django.core.management.base import BaseCommand, CommandError

from jobs import audit


class Command(BaseCommand):
    help = "Export audit rows past the retention (SF_AUDIT_RETENTION_DAYS) to CSV, then remove them"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--days", type=int, help="the retention in days (default: the setting)")
        parser.add_argument("--out", help="folder for the export (default: $SF_VAR_DIR/audit)")

    def handle(self, *args, days: int | None = None, out: str | None = None, **options) -> None:
        if days is not None and days < 1:
            raise CommandError("--days must be at least 1: the audit log keeps a day at least")
        removed, path = audit.purge(days=days, out_dir=out)
        if removed:
            self.stdout.write(f"{removed} audit row(s) exported to {path} and removed")
        else:
            self.stdout.write("no audit row is past the retention")
