"""`manage.py check --deploy`: the ledger's database and Redis must ask for a credential.

Local jobs share the server's loopback, and on Slurm, Ray and Kubernetes a job's node may reach
the server's network: a PostgreSQL that trusts connections hands any of them the ledger, and a
Redis without a password every live page's log lines and the Celery workers' commands. Each
check connects the way a stranger would (PostgreSQL with a password that is surely wrong,
Redis with none) and reports a server that lets it in. Only with `--deploy`: the checks
make connections. A server the check cannot reach is not reported here.
"""

import secrets
import stat
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Tags, register
from django.core.checks import Warning as CheckWarning

from starforge.redis_url import without_credentials

PROBE_TIMEOUT_S = 3


@register(Tags.security, deploy=True)
def database_asks_for_a_password(app_configs=None, **kwargs) -> list[CheckMessage]:
    db = settings.DATABASES["default"]
    host = str(db.get("HOST") or "")
    if db["ENGINE"] != "django.db.backends.postgresql" or not host or host.startswith("/"):
        # SQLite is a file in the private SF_VAR_DIR; over a unix socket the server's own
        # uid is what PostgreSQL's peer rule checks, which a stranger's probe cannot show.
        return []
    port, options = str(db.get("PORT") or 5432), db.get("OPTIONS") or {}
    sslmode = str(options.get("sslmode", "prefer"))
    if not _postgres_lets_in(host, port, str(db.get("NAME")), str(db.get("USER")), sslmode):
        return []
    where = f"{host}:{port}"
    return [
        CheckWarning(
            f"PostgreSQL at {where} let user {db.get('USER')!r} into {db.get('NAME')!r} with a "
            "wrong password: it trusts connections, so every process that reaches it (local "
            "jobs on this host share its loopback) can read and change the ledger.",
            hint="Ask for scram-sha-256 on host connections in pg_hba.conf and put the "
            "password in DATABASE_URL.",
            id="starforge.W001",
        )
    ]


@register(Tags.security, deploy=True)
def redis_asks_for_a_password(app_configs=None, **kwargs) -> list[CheckMessage]:
    url = settings.REDIS_URL
    parts = urlsplit(url)
    if parts.scheme == "unix" and not _others_may_connect(Path(parts.path)):
        return []  # a socket only the server's user may open is its credential
    if not _redis_lets_in(without_credentials(url)):
        return []
    where = parts.path if parts.scheme == "unix" else parts.netloc.rpartition("@")[2]
    return [
        CheckWarning(
            f"Redis at {where} answers without a password: whoever reaches it (local jobs on "
            "this host share its loopback) reads every live page's log lines, sends the "
            "Celery workers commands and can empty the queues.",
            hint="Set requirepass on that Redis and put the password in REDIS_URL "
            "(redis://:PASSWORD@host:6379/0).",
            id="starforge.W002",
        )
    ]


def _postgres_lets_in(host: str, port: str, dbname: str, user: str, sslmode: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(
            host=host,
            port=port,
            dbname=dbname,
            user=user,
            password=secrets.token_urlsafe(24),  # surely not the one it would ask for
            sslmode=sslmode,
            connect_timeout=PROBE_TIMEOUT_S,
        ):
            return True
    except psycopg.Error:
        return False


def _redis_lets_in(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(
        url,
        protocol=2,  # RESP3's HELLO would be refused for want of a password, not PING
        socket_timeout=PROBE_TIMEOUT_S,
        socket_connect_timeout=PROBE_TIMEOUT_S,
    )
    try:
        return bool(client.ping())
    except redis.RedisError:  # NOAUTH among them: it asked for a password
        return False
    finally:
        client.close()


def _others_may_connect(socket_path: Path) -> bool:
    try:
        return bool(socket_path.stat().st_mode & stat.S_IWOTH)
    except OSError:
        return False
