"""Embedded-default setup: the local cluster, a demo team with a GPU quota that may use it, a
demo user and token.

The demo user's password and token are this installation's own, made on first start and kept
under SF_VAR_DIR (mode 0600) so `make run` prints the same lines each time; nothing a reader of
the repository knows signs anyone in.
"""

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User

from jobs import grants
from jobs.actions.tokens import issue_token
from jobs.auth import hash_token
from jobs.models import ApiToken, Cluster, Membership, Team

# What the demo user's password was before installations made their own: still refused.
COMMITTED_DEMO_PASSWORD = "demo"


@dataclass(frozen=True)
class Demo:
    username: str
    password: str | None  # None: someone changed it, and only they know it
    team: str
    token: str


def ensure_demo(gpu_quota: int = 4) -> Demo:
    cluster, new_cluster = Cluster.objects.get_or_create(name="local", defaults={"kind": "local"})
    team, new_team = Team.objects.get_or_create(
        name="demo", defaults={"gpu_quota": gpu_quota, "default_cluster": cluster}
    )
    if new_cluster or new_team:
        # The README's first job runs there. Only when one of them is new: a grant an admin
        # revoked since is not given back at the next start.
        grants.grant(team, cluster, "bootstrap")
    user, created = User.objects.get_or_create(
        username="demo", defaults={"is_staff": True, "is_superuser": True}
    )
    Membership.objects.get_or_create(team=team, user=user, defaults={"role": "admin"})
    return Demo("demo", _demo_password(user, created), team.name, _demo_token(user))


def _demo_password(user: User, created: bool) -> str | None:
    """Set on creation (and over the old committed "demo"); an existing password is kept."""
    path = Path(settings.VAR_DIR) / "demo-password"
    if created or user.check_password(COMMITTED_DEMO_PASSWORD):
        password = _read_or_create_secret(path)
        user.set_password(password)
        user.save(update_fields=["password"])
        return password
    if path.exists():
        stored = path.read_text().strip()
        if stored and user.check_password(stored):
            return stored
    return None


def _read_or_create_secret(path: Path) -> str:
    """The secret in `path`, made (O_EXCL, mode 0600) when there is none yet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        stored = path.read_text().strip()
        if stored:
            return stored
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    secret = secrets.token_urlsafe(12)
    _write_secret(fd, secret)
    return secret


def _demo_token(user: User) -> str:
    """The demo token is kept in var/ so `make run` prints the same `sf login` line each time."""
    path = Path(settings.VAR_DIR) / "demo-token"
    if path.exists():
        secret = path.read_text().strip()
        if ApiToken.objects.filter(key_hash=hash_token(secret), revoked_at__isnull=True).exists():
            return secret
    secret = issue_token(user, name="demo")
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_secret(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), secret)
    return secret


def _write_secret(fd: int, secret: str) -> None:
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # whatever the umask, and an older file's mode
        out.write(secret + "\n")
