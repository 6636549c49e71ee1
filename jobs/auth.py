"""API authentication: users by hashed API token or console session, runners by a job token.

Also owns the user's tokens: create (secret shown once, sha256 stored), list and revoke, for the
API, the console and `manage.py issue_token` alike.
"""

import datetime as dt
import hashlib
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.core import signing
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer, SessionAuth

from jobs import throttle
from jobs.errors import ApiError, BadRequest, NotFound
from jobs.launcher import JOB_TOKEN_SALT
from jobs.models import ApiToken

LAST_USED_RESOLUTION = dt.timedelta(minutes=1)
NAME_MAX = ApiToken._meta.get_field("name").max_length or 100
EXPIRES_IN_DAYS_MAX = 3650


class TokenRefused(ApiError):
    """A known token that may no longer be used (revoked or expired)."""

    status = 401


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_token(user: User, name: str = "cli") -> str:
    """Create a token for `user` and return its secret; only the hash is stored."""
    return create_token(user, name)[1]


def create_token(user: User, name: str, expires_in_days: int | None = None) -> tuple[ApiToken, str]:
    """Create a token and return it with its secret, which nothing can show again."""
    name = name.strip()
    if not name:
        raise BadRequest("a token needs a name, e.g. the machine it is for")
    if len(name) > NAME_MAX:
        raise BadRequest(f"a token name is at most {NAME_MAX} characters, got {len(name)}")
    if expires_in_days is not None and not 1 <= expires_in_days <= EXPIRES_IN_DAYS_MAX:
        raise BadRequest(
            f"expires_in_days must be between 1 and {EXPIRES_IN_DAYS_MAX}, got {expires_in_days}"
        )
    now = timezone.now()
    expires_at = now + dt.timedelta(days=expires_in_days) if expires_in_days else None
    secret = ApiToken.new_secret()
    row = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=secret[:10],
        key_hash=hash_token(secret),
        created_at=now,
        expires_at=expires_at,
    )
    return row, secret


def user_tokens(user: User) -> QuerySet[ApiToken]:
    """The user's tokens, newest first, revoked and expired ones included."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-pk")


def revoke_token(user: User, token_id: int) -> ApiToken:
    """Revoke one of the user's tokens; revoking it again changes nothing."""
    ApiToken.objects.filter(pk=token_id, user=user, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    row = ApiToken.objects.filter(pk=token_id, user=user).first()
    if row is None:
        raise NotFound("no such token")
    return row


class UserToken(HttpBearer):
    def authenticate(self, request, token: str) -> User | None:
        throttle.check_token_address(request)
        row = ApiToken.objects.select_related("user").filter(key_hash=hash_token(token)).first()
        if row is None or not row.user.is_active:
            throttle.record_bad_token(request)
            return None
        now = timezone.now()
        # Raised, not declined: the caller holds a real token and deserves to know its fate.
        if row.revoked_at is not None:
            raise TokenRefused(f"token {row.prefix}… was revoked; run `sf login` with a new one")
        if row.is_expired(now):
            when = row.expires_at.strftime("%Y-%m-%d %H:%M UTC") if row.expires_at else ""
            raise TokenRefused(
                f"token {row.prefix}… expired on {when}; run `sf login` with a new one"
            )
        if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        return row.user


@dataclass(frozen=True)
class JobPrincipal:
    job_id: int
    attempt: int


class JobToken(HttpBearer):
    def authenticate(self, request, token: str) -> JobPrincipal | None:
        throttle.check_token_address(request)
        try:
            job_id, attempt = signing.Signer(salt=JOB_TOKEN_SALT).unsign(token).split(".")
            return JobPrincipal(int(job_id), int(attempt))
        except (signing.BadSignature, ValueError):
            throttle.record_bad_token(request)
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
