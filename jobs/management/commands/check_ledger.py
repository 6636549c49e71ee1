"""`manage.py check_ledger`: one line per invariant violation (with the job id); exit 1 if any."""

from django.core.management.base import BaseCommand, CommandError

from jobs.reads.ledgercheck import violations


class Command(BaseCommand):
    help = "Verify the ledger's invariants: timelines, quotas, attempts, follow-ons, metering."

    def handle(self, *args, **options) -> None:
        found = violations()
        for line in found:
            self.stdout.write(line)
        if found:
            raise CommandError(f"{len(found)} ledger violation(s)", returncode=1)
        self.stdout.write("ledger ok: no violations")
