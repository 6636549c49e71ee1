"""API authentication: users by hashed API token or console session, runners by a job token."""

import datetime as dt
import hashlib
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.core import signing
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer, SessionAuth

from jobs.launcher import JOB_TOKEN_SALT
from jobs.models import ApiToken

LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_token(user: User, name: str = "cli") -> str:
    """Create a token for `user` and return its secret; only the hash is stored."""
    secret = ApiToken.new_secret()
    ApiToken.objects.create(user=user, name=name, prefix=secret[:10], key_hash=hash_token(secret))
    return secret


class UserToken(HttpBearer):
    def authenticate(self, request, token: str) -> User | None:
        row = (
            ApiToken.objects.select_related("user")
            .filter(key_hash=hash_token(token), revoked_at__isnull=True)
            .first()
        )
        if row is None or not row.user.is_active:
            return None
        now = timezone.now()
        if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        return row.user


@dataclass(frozen=True)
class JobPrincipal:
    job_id: int
    attempt: int


class JobToken(HttpBearer):
    def authenticate(self, request, token: str) -> JobPrincipal | None:
        try:
            job_id, attempt = signing.Signer(salt=JOB_TOKEN_SALT).unsign(token).split(".")
            return JobPrincipal(int(job_id), int(attempt))
        except (signing.BadSignature, ValueError):
            return None


class ConsoleSession(SessionAuth):
    """The console's signed-in user (Django session), with CSRF checked on unsafe methods.

    Without a signed-in session it declines before the CSRF check, so a request carrying a
    missing or revoked token still gets the token's 401, not a 403 about CSRF.
    """

    def __call__(self, request: HttpRequest) -> User | None:
        if not request.user.is_authenticated:
            return None
        return super().__call__(request)
