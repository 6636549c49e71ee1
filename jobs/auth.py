"""API authentication: users by hashed API token or console session, runners by a job token.

Also owns the user's tokens: create (secret shown once, sha256 stored), list and revoke, for the
API, the console and `manage.py issue_token` alike.
"""

import datetime as dt
import hashlib
from dataclasses import dataclass, field

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer, SessionAuth

from jobs import throttle
from jobs.errors import ApiError, BadRequest, NotFound
from jobs.job_tokens import BOOTSTRAP_SALT, JOB_TOKEN_SALT, attempt_of
from jobs.models import ApiToken, Attempt
from jobs.reads.prepared import Prepared, columns, models_of
from jobs.schemas import text_fault

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
            _refuse_unusable(creator, now)
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
            f"{_when(creator.expires_at)}: {hint} expires_in_days to inherit its expiry"
        )
    return asked


def user_tokens(user: User) -> QuerySet[ApiToken]:
    """The user's tokens, newest first, revoked and expired ones included."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-pk")


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


def request_token(request: HttpRequest) -> ApiToken | None:
    """The API token that authenticated `request`; None for a console session."""
    return getattr(request, "sf_api_token", None)


def _when(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _refuse_unusable(row: ApiToken, now: dt.datetime) -> None:
    # Raised, not declined: the caller holds a real token and deserves to know its fate.
    if row.revoked_at is not None:
        raise TokenRefused(f"token {row.prefix}… was revoked; run `sf login` with a new one")
    if row.is_expired(now):
        raise TokenRefused(
            f"token {row.prefix}… expired on {_when(row.expires_at or now)}; "
            "run `sf login` with a new one"
        )


class UserToken(HttpBearer):
    """A user's API token. A known one is served whatever else its address sent; only a token
    that matches no active user's counts against the address, and an address over the limit
    gets 429 for those alone (`jobs.throttle`)."""

    def authenticate(self, request, token: str) -> User | None:
        row = _token_row(hash_token(token))
        if row is None or not row.user.is_active:
            throttle.check_token_address(request)
            throttle.record_bad_token(request)
            return None
        now = timezone.now()
        _refuse_unusable(row, now)
        if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        request.sf_api_token = row
        return row.user


# Read on every API request: its SQL is built once (jobs.reads.prepared).
TOKEN_WITH_USER = Prepared(
    lambda shape, key_hash: ApiToken.objects.filter(key_hash=key_hash).values_list(
        *columns(ApiToken), *columns(User, "user")
    )
)


def _token_row(key_hash: str) -> ApiToken | None:
    """The token of that hash with its user, as `select_related("user")` would load them."""
    rows = TOKEN_WITH_USER.rows(key_hash=key_hash)
    if not rows:
        return None
    (row,) = rows  # the hash is unique
    token, token.user = models_of(row, ApiToken, User)
    return token


@dataclass(frozen=True)
class JobPrincipal:
    job_id: int
    attempt: int
    row: Attempt = field(compare=False, repr=False)


class JobToken(HttpBearer):
    """A runner's job token (`jobs.job_tokens`). A valid one is served whatever else its
    address sent; only a token that names no attempt counts against the address, and an
    address over the limit gets 429 for those alone."""

    salt = JOB_TOKEN_SALT

    def authenticate(self, request, token: str) -> JobPrincipal | None:
        attempt = attempt_of(token, self.salt)
        if attempt is None:
            throttle.check_token_address(request)
            throttle.record_bad_token(request)
            return None
        return JobPrincipal(attempt.job_id, attempt.number, attempt)


class BootstrapToken(JobToken):
    """The one-time credential a runner exchanges for its job token (Ray, Kubernetes)."""

    salt = BOOTSTRAP_SALT


class ConsoleSession(SessionAuth):
    """The console's signed-in user (Django session), with CSRF checked on unsafe methods.

    Without a signed-in session it declines before the CSRF check, so a request carrying a
    missing or revoked token still gets the token's 401, not a 403 about CSRF.
    """

    def __call__(self, request: HttpRequest) -> User | None:
        if not request.user.is_authenticated:
            return None
        return super().__call__(request)
