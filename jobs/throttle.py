"""Brute-force throttles: failed console sign-ins, and unknown bearer tokens, counted in a cache.

Failures are counted in fixed windows in the `throttle` cache (Redis in a deployment, so every
server process shares the counts). A throttle never locks out a valid credential that other
clients' failures did not concern:

- Sign-in: a username and address pair that failed SF_LOGIN_MAX_FAILURES times within
  SF_LOGIN_WINDOW_S gets 429 on every further attempt for that username, a right password
  included (that account's brute-force protection), until the window ends; a successful
  sign-in clears its count. Failures for other usernames from the same address never count
  against it. The username is counted as the sign-in form reads it (`sign_in_name`), so no
  other spelling of one account's name (full-width letters, another case) opens a fresh count.
- Bearer tokens: the authenticator looks the token up first; a valid user or job token is
  served whatever its address sent. Only a token that matches nothing is counted against its
  address (`record_bad_token`), and once an address sent SF_TOKEN_MAX_FAILURES of those within
  SF_TOKEN_WINDOW_S, its further unknown tokens get 429 (`check_token_address`) until the
  window ends.

Requests that succeed never count. When the cache cannot be reached the throttles let requests
through (and log it) rather than lock everyone out.
"""

import hashlib
import logging
import math
import time
from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.contrib.auth.forms import UsernameField
from django.contrib.auth.views import LoginView
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from jobs.addresses import client_address
from jobs.errors import ApiError

log = logging.getLogger(__name__)
CACHE_ALIAS = "throttle"


class Throttled(ApiError):
    status = 429


def _key(kind: str, *parts: str) -> str:
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return f"{kind}:{digest}"


def seconds_blocked(key: str, limit: int) -> int:
    """Seconds until `key` may try again; 0 when it has fewer than `limit` recent failures."""
    try:
        found = caches[CACHE_ALIAS].get_many([key, f"{key}:until"])
    except Exception:  # an unreachable cache must not refuse everyone
        log.warning("throttle cache unavailable; not throttling", exc_info=True)
        return 0
    if found.get(key, 0) < limit:
        return 0
    return max(1, math.ceil(found.get(f"{key}:until", 0) - time.time()))


def record_failure(key: str, window_s: int) -> None:
    """Count one failure of `key` in its window (which starts at the first failure)."""
    try:
        cache = caches[CACHE_ALIAS]
        if cache.add(key, 0, window_s):
            cache.set(f"{key}:until", time.time() + window_s, window_s)
        cache.incr(key)
    except ValueError:
        pass  # the window ended between add and incr: this failure starts no new one
    except Exception:
        log.warning("throttle cache unavailable; failure not counted", exc_info=True)


def clear(key: str) -> None:
    try:
        caches[CACHE_ALIAS].delete_many([key, f"{key}:until"])
    except Exception:
        log.warning("throttle cache unavailable; count not cleared", exc_info=True)


# -- bearer tokens -------------------------------------------------------------------------------


def check_token_address(request: HttpRequest) -> None:
    """Refuse an unknown bearer token from an address that sent too many of them lately.

    Call it only once the token matched nothing: a valid credential is never refused here.
    """
    wait = seconds_blocked(_key("token", client_address(request)), settings.SF_TOKEN_MAX_FAILURES)
    if wait:
        raise Throttled(
            f"too many unknown tokens from your address; try again in {wait} seconds",
            retry_after=wait,
        )


def record_bad_token(request: HttpRequest) -> None:
    record_failure(_key("token", client_address(request)), settings.SF_TOKEN_WINDOW_S)


# -- console sign-in -----------------------------------------------------------------------------


def sign_in_name(raw: str) -> str:
    """The one key of every spelling of a username that signs in to one account.

    Django's sign-in form (`UsernameField`: stripped, NFKC) decides which account a spelling
    reaches, so the count starts from exactly its folding; case is folded on top, which can only
    join counts (one address failing as "Alice" and "alice"), never split one account's.
    """
    return (UsernameField().to_python(raw) or "").casefold()  # "" for an empty name


def _login_key(request: HttpRequest) -> str:
    username = sign_in_name(str(request.POST.get("username", "")))
    return _key("login", username, client_address(request))


def sign_in_view(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """A sign-in view refusing with 429 after too many failures for a username and address."""

    @wraps(view)
    def throttled(request: HttpRequest, *args, **kwargs) -> HttpResponseBase:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        key = _login_key(request)
        wait = seconds_blocked(key, settings.SF_LOGIN_MAX_FAILURES)
        if wait:
            return _too_many_sign_ins(wait)
        response = view(request, *args, **kwargs)
        if request.user.is_authenticated:
            clear(key)
        else:
            record_failure(key, settings.SF_LOGIN_WINDOW_S)
        return response

    return throttled


def _too_many_sign_ins(wait: int) -> HttpResponse:
    minutes = math.ceil(wait / 60)
    refusal = HttpResponse(
        f"Too many failed sign-ins; try again in {minutes} minute{'s' * (minutes != 1)}.\n",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    refusal["Retry-After"] = str(wait)
    return refusal


login = sign_in_view(LoginView.as_view())
