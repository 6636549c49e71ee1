"""Production settings: `DJANGO_SETTINGS_MODULE=starforge.settings_prod`.

Everything in `starforge.settings`, with DEBUG off and the security settings on; what a
deployment must say comes from the environment, and a missing or unsafe value stops the process
at start with a sentence instead of running insecurely:

SF_SECRET_KEY          required: at least 50 characters (`python -c "import secrets;
                       print(secrets.token_urlsafe(64))"`)
SF_ALLOWED_HOSTS       required: comma-separated host names the server answers to
DATABASE_URL           required: a PostgreSQL URL (the embedded SQLite is for one machine)
REDIS_URL              required: the broker and channel layer, with its password
                       (redis://:PASSWORD@host:6379/0, rediss://..., unix://:PASSWORD@/path)
SF_REDIS_TRUSTED_NETWORK=1   accept a REDIS_URL without a password: only Starforge's server
                       hosts can reach that Redis (no job, no other tenant's machine)
SF_CSRF_TRUSTED_ORIGINS   comma-separated origins (https://starforge.example.com) when the
                       console is reached through a proxy under another name
SF_BEHIND_TLS_PROXY=1  trust X-Forwarded-Proto from the proxy that terminates TLS
SF_HSTS_SECONDS        Strict-Transport-Security max-age (default one year; 0 turns it off)
SF_SSL_REDIRECT=0      leave plain-HTTP redirects to the proxy (default: Django redirects)
SF_METRICS_TOKEN       the scrape token Prometheus sends to /metrics (at least 32 characters;
                       without it, only staff users' API tokens scrape)
"""

import os

from django.core.exceptions import ImproperlyConfigured

from starforge.redis_url import password_given


def _required(name: str, why: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(f"{name} must be set in production: {why}")
    return value


# Checked before the base settings load: without the variable they would make a key of their own
# under SF_VAR_DIR, and production keys are the deployment's to manage.
_SECRET_KEY = _required("SF_SECRET_KEY", "it signs sessions and job tokens")
if len(_SECRET_KEY) < 50 or len(set(_SECRET_KEY)) < 5 or _SECRET_KEY.startswith("django-insecure"):
    raise ImproperlyConfigured(
        "SF_SECRET_KEY is too weak: use at least 50 random characters, e.g. "
        "python -c 'import secrets; print(secrets.token_urlsafe(64))'"
    )


# Also before the base settings: without the variable they would point at an embedded Redis
# that only `make run` starts, and make a password file for it under SF_VAR_DIR.
_REDIS_URL = _required("REDIS_URL", "the Celery broker and the live pages' channel layer")
if not password_given(_REDIS_URL) and os.environ.get("SF_REDIS_TRUSTED_NETWORK") != "1":
    raise ImproperlyConfigured(
        "REDIS_URL has no password: whoever reaches that Redis reads every live log line and "
        "commands the Celery workers. Set requirepass on the Redis and put it in the URL "
        "(redis://:PASSWORD@host:6379/0), or set SF_REDIS_TRUSTED_NETWORK=1 if only "
        "Starforge's server hosts can reach it"
    )

from starforge.settings import *  # noqa: E402, F403
from starforge.settings import DATABASES, _env_int  # noqa: E402

DEBUG = False
SECRET_KEY = _SECRET_KEY
ALLOWED_HOSTS = [
    host.strip()
    for host in _required("SF_ALLOWED_HOSTS", "the host names this server answers to").split(",")
    if host.strip()
]
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured(
        "DATABASE_URL must point at PostgreSQL in production (postgres://user@host/db); "
        "the embedded SQLite ledger is for a single machine"
    )
CSRF_TRUSTED_ORIGINS = [
    origin.strip()
    for origin in os.environ.get("SF_CSRF_TRUSTED_ORIGINS", "").split(",")
    if origin.strip()
]
if os.environ.get("SF_BEHIND_TLS_PROXY") == "1":
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

SECURE_SSL_REDIRECT = os.environ.get("SF_SSL_REDIRECT", "1") == "1"
# /metrics is scraped over the internal network, often by plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
if 0 < len(SF_METRICS_TOKEN) < 32:  # noqa: F405
    raise ImproperlyConfigured(
        "SF_METRICS_TOKEN is too short to be guessed by nobody: use at least 32 random "
        "characters, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    )
SECURE_HSTS_SECONDS = _env_int("SF_HSTS_SECONDS", 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
SESSION_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SECURE = True
X_FRAME_OPTIONS = "DENY"
