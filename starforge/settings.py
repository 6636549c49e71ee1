"""Settings for Starforge. Everything a deployment changes comes from the environment.

DATABASE_URL   ledger database (default: embedded SQLite under var/)
REDIS_URL      Celery broker and Channels layer (default: the embedded Redis `make run` starts
               on 127.0.0.1:SF_REDIS_PORT, 6390, with this installation's own password, kept
               in $SF_VAR_DIR/redis-password, mode 0600)
SF_VAR_DIR     root for the embedded ledger, snapshots, logs, run outputs (default: ./var);
               everything server processes write there is private to their user (umask 077)
SF_DEBUG=1     Django's debug pages, for development only (default off)
SF_SECRET_KEY  signs sessions and job tokens (default: this installation's own key, made with
               `secrets` on first start and kept in $SF_VAR_DIR/secret-key, mode 0600; never a
               string from the repository; starforge.settings_prod requires the variable)
SF_LOCAL_GPU_SLOTS   virtual GPU slots of the local executor when NVML finds no GPU (default 4)
SF_SANDBOX_ALLOW_NETS  CIDRs besides the public internet that sandboxed local jobs may reach
                     (default: none; private, shared and link-local networks are refused)
SF_SANDBOX_SOFTWARE  software folders under /tmp or /run that sandboxed jobs run with, read-only
SF_METRICS_TOKEN     a scrape token for /metrics (`Authorization: Bearer <it>`), as well as staff
                     users' API tokens (default: none, only staff tokens)
SF_METRICS_ALLOWED_NETS   CIDRs that may read /metrics without any credential (default: none;
                     trusting a network is a choice: every job on the local executor runs on
                     loopback)
SF_TRUSTED_PROXIES   CIDRs of reverse proxies whose X-Forwarded-For names the client's address
                     for the throttles and SF_METRICS_ALLOWED_NETS (default: none)
SF_SCIM_TOKEN        the identity provider's SCIM provisioning token for /scim/v2/ (default:
                     none, SCIM off)
SF_OIDC_*            OpenID Connect sign-in (jobs/oidc_config.py lists them; default: off);
                     SF_PASSWORD_LOGIN=0 turns password sign-in off once it is on
"""

import ipaddress
import os
import secrets
import time
from pathlib import Path

import dj_database_url
import plotly

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SF_VAR_DIR", BASE_DIR / "var")).resolve()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise RuntimeError(f"{name} must be an integer, got {raw!r}") from exc


def _env_cidrs(name: str) -> list[str]:
    """Comma-separated networks (10.0.0.0/8, 2001:db8::/32, or one address); a typo stops the
    process at start rather than failing requests later."""
    cidrs = [cidr.strip() for cidr in os.environ.get(name, "").split(",") if cidr.strip()]
    for cidr in cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise RuntimeError(f"{name}: {cidr!r} is not a network, e.g. 10.0.0.0/8") from exc
    return cidrs


SECRET_KEY_MIN_LENGTH = 50
REDIS_PASSWORD_MIN_LENGTH = 32


def _read_secret(path: Path, min_length: int, what: str, instead: str) -> str:
    # Another process may have created the file an instant ago and still be writing it.
    for _ in range(50):
        secret = path.read_text().strip()
        if len(secret) >= min_length:
            return secret
        time.sleep(0.1)
    raise RuntimeError(
        f"{path} holds fewer than {min_length} characters: delete it to make a new {what}, "
        f"or {instead}"
    )


def installation_secret(path: Path, nbytes: int, min_length: int, what: str, instead: str) -> str:
    """A secret of this installation's own: made once, on first start, in `path`.

    The file is created with O_EXCL, so processes starting at once (server, worker, beat) all
    end up with the one secret that won, and with mode 0600, readable by the server's user
    only. `what` names it and `instead` says what to set in its place, for the sentences."""
    if path.exists():
        return _read_secret(path, min_length, what, instead)
    try:
        private_dir(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_secret(path, min_length, what, instead)
    except OSError as exc:
        raise RuntimeError(
            f"cannot create the {what} file {path} ({exc.strerror}): make SF_VAR_DIR writable "
            f"for the server's user, or {instead}"
        ) from exc
    secret = secrets.token_urlsafe(nbytes)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # whatever the umask
        out.write(secret + "\n")
    return secret


def installation_secret_key(var_dir: Path) -> str:
    """This installation's own secret key (86 characters), in `var_dir`/secret-key."""
    return installation_secret(
        var_dir / "secret-key",
        64,
        SECRET_KEY_MIN_LENGTH,
        "secret key (that signs every user out)",
        "set SF_SECRET_KEY",
    )


def installation_redis_password(var_dir: Path) -> str:
    """The embedded Redis's password (43 characters), in `var_dir`/redis-password."""
    return installation_secret(
        var_dir / "redis-password",
        32,
        REDIS_PASSWORD_MIN_LENGTH,
        "Redis password",
        "set REDIS_URL to a Redis of your own",
    )


def private_dir(path: Path) -> None:
    """`path` and its missing parents, made 0700 (an existing folder keeps its mode)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


# Server processes make everything private to their own user from the first write (the ledger,
# its journal, logs, snapshots, beat's schedule, collected static files): a folder is 0700 and
# a file 0600 unless the code that makes it says otherwise, as the local executor does for the
# few folders a job of another uid passes through (0711). The runner sets its own umask for
# the job it starts (client/sf/runner.py).
SERVER_UMASK = 0o077
os.umask(SERVER_UMASK)

SECRET_KEY = os.environ.get("SF_SECRET_KEY") or installation_secret_key(VAR_DIR)
# Off unless a developer asks for it: Django's debug pages show settings and every URL pattern
# to whoever makes a request fail or miss.
DEBUG = os.environ.get("SF_DEBUG", "0") == "1"
ALLOWED_HOSTS = [h for h in os.environ.get("SF_ALLOWED_HOSTS", "*").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    # Before django.contrib.auth: its createsuperuser, which validates a password given in the
    # environment too, takes the place of Django's (the first app's command wins).
    "jobs",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "metering",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "jobs.oidc.SessionRecheck",  # ends an OIDC session the provider stopped vouching for
    "django.contrib.messages.middleware.MessageMiddleware",
    "jobs.audit_http.AuditTrail",  # records the changes a request makes (jobs.audit)
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "starforge.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "starforge.serving.websocket_port",
                "jobs.oidc.sign_in_options",
            ],
        },
    },
]
ASGI_APPLICATION = "starforge.asgi.application"
WSGI_APPLICATION = "starforge.wsgi.application"

# Serving (starforge.serving): HTTP from the web server's workers, websockets from the ASGI
# server. SF_SERVING is "wsgi" in a web worker (starforge.wsgi sets it before these settings
# load). SF_WEB_WORKERS: web worker processes, by default one per core and at least 2 (SQLite
# too: in WAL mode several processes read while one writes); SF_WEB_THREADS: the requests each
# serves at once (2: one waiting on a lock or a slow client leaves the process one to go on
# with; more take turns at the GIL). SF_PORT: where the console's pages are.
# SF_WS_PORT: the port the ASGI server takes websockets on when it has one of its own
# (`runstack`: SF_PORT + 1); unset, pages open them on their own origin, where a proxy routes
# /ws/ to the ASGI server.
SF_SERVING = os.environ.get("SF_SERVING", "")
SF_WEB_WORKERS = _env_int("SF_WEB_WORKERS", max(2, os.cpu_count() or 1))
SF_WEB_THREADS = _env_int("SF_WEB_THREADS", 2)
if SF_WEB_THREADS < 1:
    raise RuntimeError(f"SF_WEB_THREADS must be at least 1, got {SF_WEB_THREADS}")
SF_PORT = _env_int("SF_PORT", 8000)
SF_WS_PORT = _env_int("SF_WS_PORT", 0) or None

_default_db = f"sqlite:///{VAR_DIR / 'starforge.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(os.environ.get("DATABASE_URL") or _default_db)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Django's backend, whose writers wait for each other on a lock of their own rather than
    # in SQLite's busy handler, which sleeps up to 100 ms at a time (starforge.db.sqlite3).
    DATABASES["default"]["ENGINE"] = "starforge.db.sqlite3"
    # IMMEDIATE takes the write lock when a transaction starts, so two schedulers on the
    # embedded ledger serialise instead of failing with "database is locked" mid-transaction.
    # WAL (kept in the file once set) lets the web workers, the Celery worker and beat read
    # while one of them writes.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL",
    }
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("SF_SQLITE_TEST_DB") or None}
    # A web worker keeps its connection (a file handle) from one request to the next.
    DATABASES["default"]["CONN_MAX_AGE"] = None if SF_SERVING == "wsgi" else 0
elif SF_SERVING == "wsgi":
    # A web worker serves one request at a time and keeps its session from one request to the
    # next, checked before reuse (after an error, a restart of PostgreSQL).
    DATABASES["default"]["CONN_MAX_AGE"] = 600
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
else:
    # A connection pool: under ASGI every request runs in a fresh context, so persistent
    # connections (CONN_MAX_AGE) would open a new PostgreSQL session per request. A Celery
    # worker's tasks take their sessions from it too (starforge.celery). Each session is
    # checked as it is taken (one round trip), so one that PostgreSQL dropped (a restart) is
    # replaced rather than failing the task or request that took it.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # the pool's check as a session is taken
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": 8}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Statements bound on the server (the API's hot reads, jobs.reads.prepared; the metric
    # upserts) are prepared after 5 runs on a connection, so PostgreSQL plans them once: the
    # job page read's plan took ~5 ms, running it 0.2 ms. Django's own queries bind on the
    # client and are never prepared. SF_PG_PREPARE=0 for a pooler in transaction mode that
    # cannot keep prepared statements.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = (
        5 if os.environ.get("SF_PG_PREPARE", "1") != "0" else None
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Every door that sets a password (the console's password change, the admin, createsuperuser,
# changepassword) refuses a short, common, all-digit or user-like one.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [
    BASE_DIR / "static",
    # Plotly's own bundle, shipped inside the plotly package: /static/vendor/plotly.min.js
    ("vendor", Path(plotly.__file__).parent / "package_data"),
]
STATIC_ROOT = VAR_DIR / "static"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
# Sent on every answer, console and API alike (Django's defaults, stated so nobody drops them).
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# Redis: REDIS_URL as given (starforge.settings_prod refuses one without a password unless
# SF_REDIS_TRUSTED_NETWORK=1). Unset: the embedded Redis `make run` starts on 127.0.0.1 at
# SF_REDIS_PORT, which asks for this installation's own password: local jobs share the
# server's loopback, and a Redis that lets anyone in hands them every live page and the
# Celery workers' commands.
REDIS_EMBEDDED = not os.environ.get("REDIS_URL")
SF_REDIS_PORT = _env_int("SF_REDIS_PORT", 6390)
REDIS_URL = os.environ.get("REDIS_URL") or (
    f"redis://:{installation_redis_password(VAR_DIR)}@127.0.0.1:{SF_REDIS_PORT}/0"
)
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
# Every task is idempotent (keyed by job and attempt), so a redelivery after a worker crash is
# safe and better than a launch that never happens.
CELERY_TASK_ACKS_LATE = True
# A worker process that dies mid-task (OOM, a kill of the pool child) hands its task back at once.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fixup closes every database connection before and after each task, and in a
# prefork worker closes the connection pool with them: every tick and launch opened a new
# PostgreSQL session (4 to 7 a second), whose backend started cold and planned each query
# anew, on the cores the web workers share. With this set it does so once every 2,000 tasks;
# in between `starforge.celery` hands each task's connections back the way a web request
# does (to the pool; a broken one is dropped).
CELERY_DB_REUSE_MAX = 1000
# A task held by a worker that was killed outright (the whole host gone) becomes visible again
# after the visibility timeout, and every live worker sweeps for such tasks every few seconds:
# redelivered within a minute instead of Redis' default hour. Only tasks unacknowledged for that
# long come back: a tick that old has expired (dropped unrun) and a launch is idempotent, so a
# slow launch delivered twice launches each attempt at most once all the same.
SF_TASK_VISIBILITY_S = _env_int("SF_TASK_VISIBILITY_S", 45)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": SF_TASK_VISIBILITY_S,
    "unacked_restore_interval": 5,
    "unacked_restore_throttle": 1,
}
# The Celery worker and beat lower their CPU priority by this much as they start (0 to 19;
# starforge.celery): on a host they share with web workers, a tick's burst (admitting and
# launching a few dozen jobs takes a core 60 to 120 ms) waits for the requests in flight
# instead of making them wait. By default on PostgreSQL only: on the embedded ledger the loops
# hold its one write lock, and a worker descheduled while holding it makes every submit wait
# longer (the API mix's p99 rose from 89-93 ms to 98-109 ms; on PostgreSQL it fell from
# 110-125 ms to 89-109 ms). The local executor's runners take the worker's starting priority
# back where they may (root, CAP_SYS_NICE), so jobs do not inherit it. 0 where the workers
# have hosts of their own.
SF_WORKER_NICE = _env_int(
    "SF_WORKER_NICE", 10 if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" else 0
)
if not 0 <= SF_WORKER_NICE <= 19:
    raise RuntimeError(f"SF_WORKER_NICE must be from 0 to 19, got {SF_WORKER_NICE}")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A tick nobody picked up within 10 s is dropped: behind a slow engine (an unreachable
# cluster's timeouts), ticks would otherwise pile up and run back to back for nothing.
CELERY_BEAT_SCHEDULE = {
    "schedule-tick": {
        "task": "jobs.tasks.schedule_tick",
        "schedule": 2.0,
        "kwargs": {"from_beat": True},  # coalesced with the kicks' ticks (jobs.kick)
        "options": {"expires": 10},
    },
    "reconcile-tick": {
        "task": "jobs.tasks.reconcile_tick",
        "schedule": 2.0,
        "options": {"expires": 10},
    },
}
# The brute-force throttles' counts (jobs.throttle), shared by every server process.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "throttle": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "sf-throttle",
    },
}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}

# Starforge's own knobs.
SF_SNAPSHOT_DIR = VAR_DIR / "snapshots"
SF_LOG_DIR = VAR_DIR / "logs"
SF_OUTPUT_ROOT = Path(os.environ.get("SF_OUTPUT_ROOT", VAR_DIR / "runs")).resolve()
SF_VAR_DIR = VAR_DIR
SF_LOCAL_STATE_DIR = VAR_DIR / "local-executor"
SF_LOCAL_GPU_SLOTS = _env_int("SF_LOCAL_GPU_SLOTS", 4)
# The local executor's job sandbox (jobs.executors.sandbox): the group its network helper runs
# under (no job's), the networks besides the public internet its jobs may reach (CIDRs), and
# the device nodes a job gets in it (CUDA_VISIBLE_DEVICES chooses among them).
SF_SANDBOX_NET_GID = _env_int("SF_SANDBOX_NET_GID", 199_999)
SF_SANDBOX_ALLOW_NETS = _env_cidrs("SF_SANDBOX_ALLOW_NETS")
SF_SANDBOX_DEVICES = os.environ.get("SF_SANDBOX_DEVICES", "/dev/nvidia*")
# Software folders a sandboxed job may run with although they live under a folder the sandbox
# masks (/tmp, /var/tmp, /run, /dev/shm): a site's shared environments, read-only in every
# sandbox. The operator's list, never a job's (colon-separated absolute paths).
SF_SANDBOX_SOFTWARE = [p for p in os.environ.get("SF_SANDBOX_SOFTWARE", "").split(":") if p]
if not all(os.path.isabs(p) for p in SF_SANDBOX_SOFTWARE):
    raise RuntimeError("SF_SANDBOX_SOFTWARE must hold absolute paths, separated by ':'")
SF_MAX_SNAPSHOT_BYTES = _env_int("SF_MAX_SNAPSHOT_MB", 100) * 1024 * 1024
SF_MAX_SNAPSHOT_UNPACKED_BYTES = _env_int("SF_MAX_SNAPSHOT_UNPACKED_MB", 1024) * 1024 * 1024
SF_PENDING_DEADLINE_S = _env_int("SF_PENDING_DEADLINE_S", 1800)
SF_LOST_GRACE_S = _env_int("SF_LOST_GRACE_S", 60)
# A job the scheduler reserves GPUs for (the first one of a cluster's order that does not fit)
# that has waited this long may no longer be passed by jobs without a time limit.
SF_RESERVE_AGE_S = _env_int("SF_RESERVE_AGE_S", 900)
# Preemption (taking borrowed GPUs back): a job on borrowed GPUs that has run less than this is
# never preempted; a preempted one gets SIGTERM, then SIGKILL this long after (a cluster's
# `preempt_grace_s` setting overrides it).
SF_PREEMPT_MIN_RUNTIME_S = _env_int("SF_PREEMPT_MIN_RUNTIME_S", 600)
SF_PREEMPT_GRACE_S = _env_int("SF_PREEMPT_GRACE_S", 120)
SF_RETRY_COOLDOWN_CAP_S = _env_int("SF_RETRY_COOLDOWN_CAP_S", 3600)
SF_LAUNCH_STUCK_S = _env_int("SF_LAUNCH_STUCK_S", 30)
# A launcher's claim on an attempt (jobs.loops.launcher): longer than any launch's engine calls
# (a few Slurm commands of their timeout each, an HTTP exchange or two), so a live launcher is
# never taken over; a launch its worker died in is taken over once it passed.
SF_LAUNCH_CLAIM_S = _env_int("SF_LAUNCH_CLAIM_S", 120)
SF_LOG_BATCH_MAX_LINES = _env_int("SF_LOG_BATCH_MAX_LINES", 20000)
SF_METRIC_BATCH_MAX_POINTS = _env_int("SF_METRIC_BATCH_MAX_POINTS", 20000)
# A runner's batch in bytes: beyond it, 413 (Django's own 2.5 MB cap would answer a 500).
SF_INGEST_MAX_BODY_BYTES = _env_int("SF_INGEST_MAX_BODY_MB", 16) * 1024 * 1024
SF_LOG_PAGE_MAX_LINES = 50000
# How long a follow of a job's log (`sf job logs`, a long poll) may be held waiting for new
# lines. A web worker held is a worker no other request can have, so under WSGI a
# client that pauses between follows (`poll=true`, as `sf` does) is answered at once and told
# when to ask again (`poll_after_s`); an ASGI server waits on an event loop and holds the
# request as long as the client asks (at most 30 s).
SF_LOG_FOLLOW_HOLD_S = _env_int("SF_LOG_FOLLOW_HOLD_S", 0 if SF_SERVING == "wsgi" else 30)
# Per-attempt caps on what a job may store; past them lines and points are dropped, with one
# note in the log and on the timeline (jobs.stores.logstore, jobs.stores.metrics).
SF_ATTEMPT_MAX_LOG_BYTES = _env_int("SF_ATTEMPT_MAX_LOG_MB", 1024) * 1024 * 1024
SF_ATTEMPT_MAX_METRIC_POINTS = _env_int("SF_ATTEMPT_MAX_METRIC_POINTS", 5_000_000)
# Money: every price, cost and budget is in this one currency (metering.prices), an ISO 4217
# code such as USD or EUR.
SF_CURRENCY = os.environ.get("SF_CURRENCY", "").strip().upper() or "USD"
if not (len(SF_CURRENCY) == 3 and SF_CURRENCY.isalpha() and SF_CURRENCY.isascii()):
    raise RuntimeError(f"SF_CURRENCY must be a three-letter currency code, got {SF_CURRENCY!r}")
# A GPU is active over a report's interval when its utilisation reached this percent, idle
# below it (metering.activity).
SF_IDLE_GPU_UTIL_PERCENT = _env_int("SF_IDLE_GPU_UTIL_PERCENT", 10)
if not 0 <= SF_IDLE_GPU_UTIL_PERCENT <= 100:
    raise RuntimeError("SF_IDLE_GPU_UTIL_PERCENT must be a percent from 0 to 100")
# Brute-force throttles (jobs.throttle): failed sign-ins per username and address, unknown
# bearer tokens per address, each within a window; past the limit, 429 until the window ends.
SF_LOGIN_MAX_FAILURES = _env_int("SF_LOGIN_MAX_FAILURES", 10)
SF_LOGIN_WINDOW_S = _env_int("SF_LOGIN_WINDOW_S", 600)
SF_TOKEN_MAX_FAILURES = _env_int("SF_TOKEN_MAX_FAILURES", 20)
SF_TOKEN_WINDOW_S = _env_int("SF_TOKEN_WINDOW_S", 60)
# Websockets open only from the site's own origin (scheme, host and port of the handshake);
# these full origins too, for a proxy that rewrites Host (starforge.asgi).
SF_ALLOWED_ORIGINS = [
    o.strip() for o in os.environ.get("SF_ALLOWED_ORIGINS", "").split(",") if o.strip()
]
# How often an open websocket checks again that its session, user and membership still hold:
# the latest a stream closes when no signal said so (a raw SQL delete, an expired session).
SF_WS_RECHECK_S = _env_int("SF_WS_RECHECK_S", 5)
# Where runners reach the API; the local executor passes it to every job.
SF_API_URL = os.environ.get("SF_API_URL", "http://127.0.0.1:8000")
# /metrics answers a staff user's API token or this scrape token (empty: none configured) ...
SF_METRICS_TOKEN = os.environ.get("SF_METRICS_TOKEN", "").strip()
# ... and, only where an admin says so, any caller from these CIDRs (comma-separated): jobs on
# the local executor share the server's loopback, so no network is trusted by default.
SF_METRICS_ALLOWED_NETS = _env_cidrs("SF_METRICS_ALLOWED_NETS")
# Reverse proxies (CIDRs) whose X-Forwarded-For is believed for the client's address
# (jobs.addresses): default none, every address is the connection's.
SF_TRUSTED_PROXIES = _env_cidrs("SF_TRUSTED_PROXIES")
# Audit rows older than this many days are exported, then removed (`manage.py audit_purge`).
SF_AUDIT_RETENTION_DAYS = _env_int("SF_AUDIT_RETENTION_DAYS", 365)
# OpenID Connect sign-in (jobs.oidc; the variables: jobs.oidc_config). None: password only.
from jobs.oidc_config import oidc_from_environ, password_login  # noqa: E402  (stdlib only)

SF_OIDC = oidc_from_environ(os.environ)
SF_PASSWORD_LOGIN = password_login(os.environ, SF_OIDC)
# The OIDC backend answers only the provider's callback; without password sign-in (the
# console's form and the admin's) Django's ModelBackend is left out.
AUTHENTICATION_BACKENDS = [
    *(["django.contrib.auth.backends.ModelBackend"] if SF_PASSWORD_LOGIN else []),
    "jobs.oidc.Backend",
]
# SCIM 2.0 provisioning under /scim/v2/ (jobs.scim): the identity provider's one credential,
# `Authorization: Bearer <SF_SCIM_TOKEN>`; empty: SCIM is off (401). Never a user's token.
SF_SCIM_TOKEN = os.environ.get("SF_SCIM_TOKEN", "").strip()
# Where resources' locations point when no request says (the request's own host otherwise).
SF_SCIM_BASE_URL = os.environ.get("SF_SCIM_BASE_URL", "http://localhost/")
SCIM_SERVICE_PROVIDER = {
    "NETLOC": "localhost",  # unused: jobs.scim.base_location answers from the request
    "AUTHENTICATION_SCHEMES": [
        {
            "type": "oauthbearertoken",
            "name": "Provisioning token",
            "description": "Authorization: Bearer <SF_SCIM_TOKEN>",
        }
    ],
    "AUTH_CHECK_MIDDLEWARE": "jobs.scim.ProvisioningAuth",
    "USER_ADAPTER": "jobs.scim.ScimUser",
    "GROUP_ADAPTER": "jobs.scim.ScimGroup",
    "GROUP_MODEL": "jobs.models.Team",
    "BASE_LOCATION_GETTER": "jobs.scim.base_location",
    "SCHEMAS_GETTER": "jobs.scim.schemas",
    "SERVICE_PROVIDER_CONFIG_MODEL": "jobs.scim.ServiceProviderConfig",
}
# Python that starts the job-side runner (local executor; default for Slurm and Ray clusters).
SF_RUNNER_PYTHON = os.environ.get("SF_RUNNER_PYTHON", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("SF_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# Storage: where snapshots and logs keep their bytes (jobs.stores.objects). Unset: the local
# directories above; file:///path: local directories under that path; s3://bucket/prefix?...:
# S3-compatible object storage, which every server host can share. A URL that cannot be used
# stops the start-up here, with a sentence.
from jobs.stores.objects import parse_storage_url  # noqa: E402  (stdlib and Django only)

SF_STORAGE = parse_storage_url(os.environ.get("SF_STORAGE_URL", ""))
if SF_STORAGE.root is not None:
    SF_SNAPSHOT_DIR = SF_STORAGE.root / "snapshots"
    SF_LOG_DIR = SF_STORAGE.root / "logs"
# With object storage, an attempt's log batches wait in the ledger until this many bytes are
# pending, then go to the store as one object (and all of it as one object once it ended).
SF_LOG_SEGMENT_BYTES = _env_int("SF_LOG_SEGMENT_MB", 32) * 1024 * 1024
CELERY_BEAT_SCHEDULE["compact-ended-logs"] = {
    "task": "jobs.tasks.compact_ended_logs",
    "schedule": 60.0,
    "options": {"expires": 50},
}

# Notifications (jobs.webhooks). Staff may let webhooks reach these networks (CIDRs, comma
# separated), which are otherwise refused with every loopback, link-local and private address.
SF_WEBHOOK_ALLOWED_NETS = _env_cidrs("SF_WEBHOOK_ALLOWED_NETS")
# The console's address as people reach it, for the links notifications carry.
SF_CONSOLE_URL = os.environ.get("SF_CONSOLE_URL", SF_API_URL)
# Email (mailto: webhooks) goes through Django's email backend once EMAIL_HOST is set.
EMAIL_HOST = os.environ.get("EMAIL_HOST", "")
EMAIL_PORT = _env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = os.environ.get("EMAIL_USE_TLS", "") == "1"
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "starforge@localhost")
SF_NOTIFY_EMAIL = bool(EMAIL_HOST)
CELERY_BEAT_SCHEDULE["deliver-webhooks"] = {
    "task": "jobs.tasks.deliver_webhooks",
    "schedule": 10.0,
    "options": {"expires": 9},
}
CELERY_BEAT_SCHEDULE["notify-waiting"] = {
    "task": "jobs.tasks.notify_waiting",
    "schedule": 60.0,
    "options": {"expires": 50},
}
# Audit rows past SF_AUDIT_RETENTION_DAYS: exported to $SF_VAR_DIR/audit/, then removed, daily.
CELERY_BEAT_SCHEDULE["audit-purge"] = {
    "task": "jobs.tasks.purge_audit",
    "schedule": 86400.0,
    "options": {"expires": 3600},
}
