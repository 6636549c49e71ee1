"""`manage.py issue_token USER`: create an API token for a user and print it once."""

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError

from jobs.actions.tokens import issue_token


class Command(BaseCommand):
    help = "Create an API token for USER and print it (only its hash is stored)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label to recognise the token by")

    def handle(self, *args, username: str, name: str, **options) -> None:
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(
                f"no user named {username!r}; create one with createsuperuser or in the admin"
            )
        self.stdout.write(issue_token(user, name=name))
