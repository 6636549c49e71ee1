"""Recording the audit log (`jobs.audited.AuditEntry`): the one function every door calls,
`record`, and the retention purge.

The doors: HTTP requests that change something (the API, which the CLI uses, and the console)
are recorded once, at the door, by `jobs.audit_http.AuditTrail`; the Django admin by its own
log (`jobs.audit_signals`: every LogEntry the admin writes), sign-in, sign-out and failed
sign-ins by Django's signals there too; SCIM and OpenID sign-in call `record` themselves. A
call to `record` during a request marks it recorded, and the door then adds no row of its own.

    record(actor, action, target, before=None, after=None, request=None, token=None)

`actor` is the person (a User, or for a failed sign-in the name tried, or None); `target` a
model instance, a `Target`, or text; `before`/`after` the settings changed (JSON-able values;
never a secret). The request (address, door, token) defaults to the one being served.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.http import HttpRequest
from django.utils import timezone

from jobs.addresses import client_address
from jobs.audited import AuditEntry
from jobs.reads.audit import csv_rows

# Purging is the one path past the trigger: this session variable, set LOCAL to one transaction.
PURGE_SETTING = "starforge.audit_purge"
FIELD_MAX = {"actor": 150, "target": 200, "action": 64, "target_id": 64, "address": 64}


@dataclass(frozen=True)
class Target:
    kind: str
    id: str = ""
    label: str = ""
    team_id: int | None = None
    team: str = ""


@dataclass
class Call:
    """The request being served, as the audit log sees it."""

    request: HttpRequest
    recorded: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


_current: contextvars.ContextVar[Call | None] = contextvars.ContextVar("audit_call", default=None)


def serving(request: HttpRequest) -> contextvars.Token:
    """Mark `request` as the one being served (the door's middleware); `done` with the result."""
    return _current.set(Call(request))


def done(mark: contextvars.Token) -> None:
    _current.reset(mark)


def current() -> Call | None:
    return _current.get()


def record(
    actor: Any,
    action: str,
    target: Any,
    before: dict | None = None,
    after: dict | None = None,
    request: HttpRequest | None = None,
    token: Any = None,
) -> AuditEntry:
    """Write one audit row now (inside the caller's transaction, if any)."""
    call = current()
    if request is None and call is not None:
        request = call.request
    if call is not None and (request is None or request is call.request):
        call.recorded += 1
    if token is None and request is not None:
        token = getattr(request, "sf_api_token", None)
    aimed = as_target(target)
    actor_id, actor_name = _actor(actor)
    return AuditEntry.objects.create(
        actor_id=actor_id,
        actor=actor_name[: FIELD_MAX["actor"]],
        token_id=getattr(token, "pk", None),
        token=getattr(token, "prefix", "") or "",
        door=door_of(request),
        action=action[: FIELD_MAX["action"]],
        target_type=aimed.kind[:32],
        target_id=str(aimed.id)[: FIELD_MAX["target_id"]],
        target=aimed.label[: FIELD_MAX["target"]],
        team_id=aimed.team_id,
        team=aimed.team[:50],
        before=_plain(before),
        after=_plain(after),
        address=(client_address(request) if request is not None else "")[: FIELD_MAX["address"]],
    )


def door_of(request: HttpRequest | None) -> str:
    if request is None:
        return "command"
    path = request.path
    if path.startswith("/api/"):
        return "api"
    if path.startswith("/admin/"):
        return "admin"
    if path.startswith("/scim/"):
        return "scim"
    if path.startswith("/accounts/") or path.startswith("/oidc/"):
        return "sign-in"
    return "console"


def as_target(target: Any) -> Target:
    """A model instance, a `Target` or text, as the row names it, with the team it is of."""
    if isinstance(target, Target):
        return target
    if target is None:
        return Target("")
    if isinstance(target, models.Model):
        return _model_target(target)
    return Target("", "", str(target))


def _model_target(obj: models.Model) -> Target:
    kind = obj._meta.model_name or ""
    kind = {"apitoken": "token", "jobarray": "array", "membership": "member"}.get(kind, kind)
    if kind == "team":
        return Target("team", str(obj.pk), str(obj), obj.pk, str(obj))
    if kind == "token":
        label = f"{getattr(obj, 'name', '')} ({getattr(obj, 'prefix', '')}…)"
        return Target(kind, str(obj.pk), label)
    if kind == "member":
        team = _team_name(obj.team_id)  # type: ignore[attr-defined]
        user = obj.user.username  # type: ignore[attr-defined]
        return Target(kind, str(obj.pk), f"{user} in {team}", obj.team_id, team)  # type: ignore[attr-defined]
    team_id = getattr(obj, "team_id", None)
    label = f"{kind} {obj.pk}" if kind in ("job", "array", "webhook") else str(obj)
    return Target(kind, str(obj.pk), label, team_id, _team_name(team_id))


def _team_name(team_id: int | None) -> str:
    if team_id is None:
        return ""
    from jobs.models import Team  # the ledger's models load after this module

    return Team.objects.filter(pk=team_id).values_list("name", flat=True).first() or ""


def _actor(actor: Any) -> tuple[int | None, str]:
    if actor is None:
        return None, ""
    if isinstance(actor, str):
        return None, actor
    if getattr(actor, "is_authenticated", False):
        return actor.pk, actor.get_username()
    return None, ""


def _plain(value: dict | None) -> Any:
    """`value` as JSON stores it (dates, decimals and UUIDs as text)."""
    if value is None:
        return None
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder, default=str))


def changed(before: dict | None, after: dict | None) -> tuple[dict | None, dict | None]:
    """Only the keys whose value differs, each side; (None, None) when nothing did."""
    before, after = _plain(before) or {}, _plain(after) or {}
    keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if not keys:
        return None, None
    return {k: before.get(k) for k in keys}, {k: after.get(k) for k in keys}


def retention_days() -> int:
    """SF_AUDIT_RETENTION_DAYS (default 365): rows older are exported, then purged."""
    return int(getattr(settings, "SF_AUDIT_RETENTION_DAYS", 365))


def purge(now: dt.datetime | None = None, days: int | None = None, out_dir=None) -> tuple[int, str]:
    """Export the rows older than the retention to a CSV file, then remove them; returns how
    many and the file. The file is written and synced before the rows go, in the transaction
    that removes them, so a failed export removes nothing."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=retention_days() if days is None else days)
    folder = Path(out_dir or Path(settings.SF_VAR_DIR) / "audit")
    folder.mkdir(parents=True, exist_ok=True)
    with transaction.atomic():
        old = AuditEntry.objects.filter(time__lt=cutoff).order_by("id")
        last = old.values_list("id", flat=True).last()
        if last is None:
            return 0, ""
        rows = list(old.filter(id__lte=last))
        path = folder / f"audit-until-{cutoff:%Y%m%dT%H%M%SZ}-{last}.csv"
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(csv_rows(rows).getvalue())
            f.flush()
            os.fsync(f.fileno())
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"SET LOCAL {PURGE_SETTING} = 'on'")
            table = AuditEntry._meta.db_table
            cursor.execute(
                f"DELETE FROM {table} WHERE id <= %s AND time < %s",  # noqa: S608 - our table
                [last, cutoff],
            )
            removed = cursor.rowcount
    return removed, str(path)


def now() -> dt.datetime:
    return timezone.now()


# What a row shows of a target's settings before and after a change; never a secret.
STATE_FIELDS = {
    "job": ("status", "priority"),
    "member": ("role",),
    "token": ("name", "revoked_at", "expires_at"),
    "webhook": ("events", "team_id", "wait_after_s"),
    "gpuprice": ("cluster_id", "gpu_type", "per_gpu_hour", "valid_from"),
}
SECRET_FIELDS = frozenset({"key_hash", "secret", "password", "url"})
KIND_MODELS = {
    "job": "Job",
    "array": "JobArray",
    "team": "Team",
    "member": "Membership",
    "token": "ApiToken",
    "webhook": "Webhook",
    "gpuprice": "GpuPrice",
}


def _model(kind: str):
    from jobs import models as ledger

    return getattr(ledger, KIND_MODELS[kind])


def find_target(kind: str, kwargs: dict) -> Target | None:
    """The target a route's arguments name, as it is now (None: there is none)."""
    if kind == "member":
        found = (
            _model("member")
            .objects.select_related("team", "user")
            .filter(team__name=kwargs.get("name"), user__username=kwargs.get("username"))
            .first()
        )
        if found is None:
            return None
        return Target(
            "member",
            str(found.pk),
            f"{found.user.username} in {found.team.name}",
            found.team_id,
            found.team.name,
        )
    if kind == "team":
        found = _model("team").objects.filter(name=kwargs.get("name")).first()
    elif kind in KIND_MODELS:
        key = kwargs.get(f"{kind}_id")
        found = _model(kind).objects.filter(pk=key).first() if str(key).isdigit() else None
    else:
        found = None
    return None if found is None else _model_target(found)


def state_of_target(target: Target | None) -> dict | None:
    """The target's settings now, as a row's before or after shows them; None when gone."""
    if target is None or target.kind not in KIND_MODELS or not target.id:
        return None
    obj = _model(target.kind).objects.filter(pk=target.id).first()
    return None if obj is None else state_of(obj, target.kind)


def state_of(obj: models.Model, kind: str = "") -> dict:
    names = STATE_FIELDS.get(kind)
    if names is None:
        names = tuple(
            f.attname for f in obj._meta.concrete_fields if f.attname not in SECRET_FIELDS
        )
    state = {name: getattr(obj, name) for name in names}
    if kind == "team":
        state.update(_team_extras(obj))
    return _plain(state)


def _team_extras(team: models.Model) -> dict:
    from jobs.models import ActivityPolicy, ClusterGrant

    grants = ClusterGrant.objects.filter(team_id=team.pk).order_by("cluster__name")
    extras: dict[str, Any] = {"clusters": list(grants.values_list("cluster__name", flat=True))}
    policy = ActivityPolicy.objects.filter(team_id=team.pk).first()
    if policy is not None:
        for f in policy._meta.concrete_fields:
            if f.attname != "team_id":
                extras[f"activity_policy.{f.attname}"] = getattr(policy, f.attname)
    return extras


def snapshot_target(sha: str, request: HttpRequest) -> Target:
    from jobs.models import SnapshotOwner

    claim = (
        SnapshotOwner.objects.select_related("team")
        .filter(snapshot_id=sha, uploaded_by_id=getattr(getattr(request, "auth", None), "pk", None))
        .order_by("-pk")
        .first()
    )
    if claim is None:
        return Target("snapshot", sha, f"snapshot {sha[:12]}")
    return Target("snapshot", sha, f"snapshot {sha[:12]}", claim.team_id, claim.team.name)


# Who made a row of a kind, for `newest_made`.
MADE_BY = {"token": "user", "webhook": "owner", "gpuprice": None}


def newest_made(kind: str, user: Any, since: dt.datetime) -> Target | None:
    """The newest row of `kind` made since `since` (by `user`, where the row says who)."""
    if kind not in MADE_BY:
        return None
    rows = _model(kind).objects.filter(created_at__gte=since)
    made_by = MADE_BY[kind]
    if made_by is not None:
        rows = rows.filter(**{made_by: user})
    row = rows.order_by("-pk").first()
    return None if row is None else _model_target(row)
