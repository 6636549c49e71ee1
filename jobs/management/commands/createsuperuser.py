"""Django's `createsuperuser`, except that a password given in DJANGO_SUPERUSER_PASSWORD (with
--noinput) must pass the password validators too, as a typed one must: otherwise a script
could still make a staff account whose password is `1`."""

import os

from django.contrib.auth.management.commands import createsuperuser
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError


class Command(createsuperuser.Command):
    def handle(self, *args, **options) -> None:
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        if not options["interactive"] and password is not None:
            username = options.get("username") or os.environ.get("DJANGO_SUPERUSER_USERNAME", "")
            email = options.get("email") or os.environ.get("DJANGO_SUPERUSER_EMAIL", "")
            try:
                validate_password(password, User(username=username, email=email))
            except ValidationError as refused:
                raise CommandError(
                    "DJANGO_SUPERUSER_PASSWORD is refused: " + " ".join(refused.messages)
                ) from None
        super().handle(*args, **options)
