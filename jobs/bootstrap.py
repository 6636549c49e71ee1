"""Embedded-default setup: the local cluster, a demo team with a GPU quota, a demo user+token."""

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User

from jobs.auth import hash_token, issue_token
from jobs.models import ApiToken, Cluster, Membership, Team


@dataclass(frozen=True)
class Demo:
    username: str
    password: str
    team: str
    token: str


def ensure_demo(gpu_quota: int = 4) -> Demo:
    cluster, _ = Cluster.objects.get_or_create(name="local", defaults={"kind": "local"})
    team, _ = Team.objects.get_or_create(
        name="demo", defaults={"gpu_quota": gpu_quota, "default_cluster": cluster}
    )
    user, created = User.objects.get_or_create(
        username="demo", defaults={"is_staff": True, "is_superuser": True}
    )
    if created:
        user.set_password("demo")
        user.save()
    Membership.objects.get_or_create(team=team, user=user, defaults={"role": "admin"})
    return Demo("demo", "demo", team.name, _demo_token(user))


def _demo_token(user: User) -> str:
    """The demo token is kept in var/ so `make run` prints the same `sf login` line each time."""
    path = Path(settings.VAR_DIR) / "demo-token"
    if path.exists():
        secret = path.read_text().strip()
        if ApiToken.objects.filter(key_hash=hash_token(secret), revoked_at__isnull=True).exists():
            return secret
    secret = issue_token(user, name="demo")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return secret
