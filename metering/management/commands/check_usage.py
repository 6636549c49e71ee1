"""`manage.py check_usage`: do the usage records agree exactly with the metered attempts?

Prints one line per violation and exits 1, or one line saying how many attempts agree.
"""

from django.core.management.base import BaseCommand, CommandError

from metering.consistency import check_usage_records


class Command(BaseCommand):
    help = "Check that the usage records agree exactly with the metered attempts."

    def handle(self, *args, **options) -> None:
        check = check_usage_records()
        for line in check.violations:
            self.stdout.write(line)
        if check.violations:
            raise CommandError(f"{len(check.violations)} usage violation(s)", returncode=1)
        self.stdout.write(f"usage records agree with {check.metered_attempts} metered attempts")
