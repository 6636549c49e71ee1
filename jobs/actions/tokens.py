"""The token verbs a user uses: create an API token (its secret shown once, its sha256 stored)
and revoke one with every token it created. API, console, the Django admin and `manage.py
issue_token` all come through here; authenticating with a token is `jobs.auth`.
"""

import datetime as dt

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from jobs.auth import hash_token, refuse_unusable, token_time
from jobs.errors import BadRequest, NotFound
from jobs.models import ApiToken
from jobs.schemas import text_fault

NAME_MAX = ApiToken._meta.get_field("name").max_length or 100
EXPIRES_IN_DAYS_MAX = 3650


def issue_token(user: User, name: str = "cli") -> str:
    """Create a token for `user` and return its secret; only the hash is stored."""
    return create_token(user, name)[1]


def create_token(
    user: User, name: str, expires_in_days: int | None = None, creator: ApiToken | None = None
) -> tuple[ApiToken, str]:
    """Create a token and return it with its secret, which nothing can show again.

    `creator` is the token that authenticated the request, if any (None from the console
    session or a shell): the new token cannot outlive it, inherits its expiry when none is
    asked for, and is revoked with it.
    """
    name = name.strip()
    if not name:
        raise BadRequest("a token needs a name, e.g. the machine it is for")
    if fault := text_fault(name):  # the console's form sends what the API's schema refuses
        raise BadRequest(f"a token name {fault}")
    if len(name) > NAME_MAX:
        raise BadRequest(f"a token name is at most {NAME_MAX} characters, got {len(name)}")
    if expires_in_days is not None and not 1 <= expires_in_days <= EXPIRES_IN_DAYS_MAX:
        raise BadRequest(
            f"expires_in_days must be between 1 and {EXPIRES_IN_DAYS_MAX}, got {expires_in_days}"
        )
    now = timezone.now()
    expires_at = now + dt.timedelta(days=expires_in_days) if expires_in_days else None
    secret = ApiToken.new_secret()
    with transaction.atomic():
        if creator is not None:
            # Locked, so a revocation of the creator running now either sees this token or
            # is seen by it.
            creator = ApiToken.objects.select_for_update().get(pk=creator.pk)
            refuse_unusable(creator, now)
            expires_at = _bounded_by_creator(expires_at, creator, now)
        row = ApiToken.objects.create(
            user=user,
            name=name,
            prefix=secret[:10],
            key_hash=hash_token(secret),
            created_at=now,
            expires_at=expires_at,
            created_by=creator,
        )
    return row, secret


def _bounded_by_creator(
    asked: dt.datetime | None, creator: ApiToken, now: dt.datetime
) -> dt.datetime | None:
    if creator.expires_at is None:
        return asked
    if asked is None:
        return creator.expires_at
    if asked > creator.expires_at:
        days = (creator.expires_at - now).days
        hint = f"ask for at most {days} days or omit" if days >= 1 else "omit"
        raise BadRequest(
            f"a token cannot outlive the token that creates it, which expires on "
            f"{token_time(creator.expires_at)}: {hint} expires_in_days to inherit its expiry"
        )
    return asked


def revoke_token(user: User, token_id: int) -> ApiToken:
    """Revoke one of the user's tokens and every token it created, recursively; revoking again
    changes nothing (the first revocation time stays)."""
    now = timezone.now()
    with transaction.atomic():
        row = ApiToken.objects.select_for_update().filter(pk=token_id, user=user).first()
        if row is None:
            raise NotFound("no such token")
        level = [row.pk]
        while level:
            ApiToken.objects.filter(pk__in=level, revoked_at__isnull=True).update(revoked_at=now)
            level = list(ApiToken.objects.filter(created_by__in=level).values_list("pk", flat=True))
    row.refresh_from_db()
    return row
