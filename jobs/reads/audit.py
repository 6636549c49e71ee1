"""The audit log as its readers see it: staff every row, a team admin the rows of the teams
they administer (a row is a team's when its target is the team or something of it), nobody
else any. A filter naming a team the reader does not administer is the 404 of an unknown team,
so another team's rows are never listed nor confirmed to exist. Nothing here writes.
"""

import datetime as dt
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet

from jobs.audited import AuditEntry
from jobs.errors import BadRequest, NotFound
from jobs.models import Membership, Team

PAGE_MAX = 500


@dataclass(frozen=True)
class AuditFilter:
    actor: str | None = None
    action: str | None = None  # exact, or a prefix ending in "." ("job.")
    target: str | None = None  # KIND or KIND:ID-or-label ("job:7", "team:vision")
    team: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    before: int | None = None  # an entry id to page back from
    limit: int = 50


def admin_team_ids(user: User) -> set[int] | None:
    """The teams whose rows `user` reads; None: every row (staff)."""
    if user.is_staff:
        return None
    return set(
        Membership.objects.filter(user=user, role=Membership.Role.ADMIN).values_list(
            "team_id", flat=True
        )
    )


def may_read_audit(user: User) -> bool:
    teams = admin_team_ids(user)
    return teams is None or bool(teams)


def visible_entries(user: User) -> QuerySet[AuditEntry]:
    teams = admin_team_ids(user)
    rows = AuditEntry.objects.all()
    return rows if teams is None else rows.filter(team_id__in=teams)


def get_entry(user: User, entry_id: int) -> AuditEntry:
    found = visible_entries(user).filter(pk=entry_id).first()
    if found is None:
        raise NotFound(f"audit entry {entry_id} does not exist or is not of a team you administer")
    return found


def entries(user: User, wanted: AuditFilter) -> list[AuditEntry]:
    """A page of the rows `user` reads that match, newest first (limit + 1 to tell more)."""
    rows = _filtered(user, wanted)
    if wanted.before is not None:
        rows = rows.filter(pk__lt=wanted.before)
    return list(rows.order_by("-pk")[: min(wanted.limit, PAGE_MAX) + 1])


def all_entries(user: User, wanted: AuditFilter) -> QuerySet[AuditEntry]:
    """Every matching row `user` reads, oldest first (the CSV)."""
    return _filtered(user, wanted).order_by("pk")


def _filtered(user: User, wanted: AuditFilter) -> QuerySet[AuditEntry]:
    rows = visible_entries(user)
    if wanted.team:
        rows = rows.filter(team_id=_readable_team(user, wanted.team))
    if wanted.actor:
        rows = rows.filter(actor=wanted.actor)
    if wanted.action:
        rows = (
            rows.filter(action__startswith=wanted.action)
            if wanted.action.endswith(".")
            else rows.filter(action=wanted.action)
        )
    if wanted.target:
        kind, _, name = wanted.target.partition(":")
        rows = rows.filter(target_type=kind)
        if name:
            rows = rows.filter(Q(target_id=name) | Q(target=name))
    if wanted.since and wanted.until and wanted.since > wanted.until:
        raise BadRequest("since must not be after until")
    if wanted.since:
        rows = rows.filter(time__gte=wanted.since)
    if wanted.until:
        rows = rows.filter(time__lt=wanted.until)
    return rows


def _readable_team(user: User, name: str) -> int:
    teams = admin_team_ids(user)
    found = Team.objects.filter(name=name).values_list("pk", flat=True).first()
    if found is None or (teams is not None and found not in teams):
        raise NotFound(f"team {name} does not exist or you do not administer it")
    return found
