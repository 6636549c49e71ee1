"""API authentication: users by hashed API token or console session, runners by a job token,
and the MLflow endpoint's callers (`mlflow_caller`): a job's tracking token or a user's token.

Also the rules a user's token is held to wherever it is used, to authenticate or to create
another (`jobs.actions.tokens`): only its sha256 is kept, and a revoked or expired one is
refused with a sentence.
"""

import datetime as dt
import hashlib
from dataclasses import dataclass, field

from django.contrib.auth.models import User
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer, SessionAuth
from sf.contract import TRACKING_TOKEN_PREFIX

from jobs import throttle
from jobs.errors import ApiError
from jobs.job_tokens import BOOTSTRAP_SALT, JOB_TOKEN_SALT, attempt_of, tracking_attempt_of
from jobs.models import ApiToken, Attempt
from jobs.reads.prepared import Prepared, columns, models_of

LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


class TokenRefused(ApiError):
    """A known token that may no longer be used (revoked or expired)."""

    status = 401


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def request_token(request: HttpRequest) -> ApiToken | None:
    """The API token that authenticated `request`; None for a console session."""
    return getattr(request, "sf_api_token", None)


def token_time(moment: dt.datetime) -> str:
    """A token's expiry as refusals say it."""
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def refuse_unusable(row: ApiToken, now: dt.datetime) -> None:
    """Raise TokenRefused for a token revoked or expired at `now`."""
    # Raised, not declined: the caller holds a real token and deserves to know its fate.
    if row.revoked_at is not None:
        raise TokenRefused(f"token {row.prefix}… was revoked; run `sf login` with a new one")
    if row.is_expired(now):
        raise TokenRefused(
            f"token {row.prefix}… expired on {token_time(row.expires_at or now)}; "
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
        refuse_unusable(row, now)
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


@dataclass(frozen=True)
class TrackingPrincipal:
    """A job's own code, by its attempt's MLflow tracking token: it may only add to that attempt."""

    job_id: int
    attempt: int
    row: Attempt = field(compare=False, repr=False)


def mlflow_caller(request: HttpRequest) -> User | TrackingPrincipal | None:
    """Who calls the MLflow endpoint: a tracking token's attempt (`sft.…`), or a user by their API
    token; None without a bearer token or for one that names neither (counted against the
    address like every unknown token, `jobs.throttle`). A job token, a bootstrap token or a
    console session is no MLflow credential. Raises TokenRefused for a revoked or expired user
    token, Throttled for an address over the limit."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    if token.startswith(TRACKING_TOKEN_PREFIX):
        attempt = tracking_attempt_of(token)
        if attempt is None:
            throttle.check_token_address(request)
            throttle.record_bad_token(request)
            return None
        return TrackingPrincipal(attempt.job_id, attempt.number, attempt)
    return UserToken().authenticate(request, token)
