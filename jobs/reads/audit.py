"""The audit log as its readers see it: staff every row, a team admin the rows of the teams
they administer (a row is a team's when its target is the team or something of it), nobody
else any. A filter naming a team the reader does not administer is the 404 of an unknown team,
so another team's rows are never listed nor confirmed to exist. Nothing here writes.
"""

import csv
import datetime as dt
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet

from jobs.audited import AuditEntry
from jobs.errors import BadRequest, NotFound
from jobs.models import Membership, Team

PAGE_MAX = 500
CSV_COLUMNS = (
    "id", "time", "actor", "token", "door", "action", "target_type", "target_id", "target",
    "team", "before", "after", "address",
)  # fmt: skip


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
    since, until = _utc("since", wanted.since), _utc("until", wanted.until)
    if since and until and since > until:
        raise BadRequest("since must not be after until")
    if since:
        rows = rows.filter(time__gte=since)
    if until:
        rows = rows.filter(time__lt=until)
    return rows


def _utc(name: str, moment: dt.datetime | None) -> dt.datetime | None:
    """A time filter in UTC (naive: UTC), whatever offset it came with."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError as exc:
        raise BadRequest(f"{name} is out of range") from exc


def _readable_team(user: User, name: str) -> int:
    teams = admin_team_ids(user)
    found = Team.objects.filter(name=name).values_list("pk", flat=True).first()
    if found is None or (teams is not None and found not in teams):
        raise NotFound(f"team {name} does not exist or you do not administer it")
    return found


def csv_rows(entries: Iterable[AuditEntry]) -> io.StringIO:
    """The rows as CSV (header first), the shape the console's export and the purge write."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for e in entries:
        writer.writerow(csv_row(e))
    return out


def csv_row(e: AuditEntry) -> list[str]:
    dumped = {
        k: json.dumps(getattr(e, k)) if getattr(e, k) is not None else ""
        for k in ("before", "after")
    }
    return [
        str(e.pk),
        e.time.isoformat(),
        _cell(e.actor),
        e.token,
        e.door,
        e.action,
        e.target_type,
        _cell(e.target_id),
        _cell(e.target),
        _cell(e.team),
        _cell(dumped["before"]),
        _cell(dumped["after"]),
        e.address,
    ]


def _cell(text: str) -> str:
    """Text a spreadsheet will not run as a formula (CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def csv_chunks(rows: QuerySet[AuditEntry]) -> Iterator[str]:
    """The rows as CSV text, header first, a thousand rows a chunk (a streamed download)."""
    yield csv_rows([]).getvalue()
    batch: list[AuditEntry] = []
    for e in rows.iterator(chunk_size=1000):
        batch.append(e)
        if len(batch) == 1000:
            yield _without_header(batch)
            batch = []
    if batch:
        yield _without_header(batch)


def _without_header(batch: list[AuditEntry]) -> str:
    return csv_rows(batch).getvalue().split("\r\n", 1)[1]


PAIRING = dt.timedelta(seconds=10)  # an event and the audit row of the request that made it


def job_people(user: User, job) -> list[dict]:
    """The changes people made to a job (or to its array), as the audit log names them: when,
    who, what, through which door; the token and the address only for a reader of the audit
    log (staff, the team's admins)."""
    rows = AuditEntry.objects.filter(
        Q(target_type="job", target_id=str(job.pk))
        | Q(target_type="array", target_id=str(job.array_id or ""))
    ).order_by("pk")
    reads = admin_team_ids(user)
    full = reads is None or job.team_id in reads
    return [
        {
            "time": e.time,
            "actor": e.actor,
            "action": e.action,
            "door": e.door,
            "token": e.token if full else "",
            "address": e.address if full else "",
            "before": e.before if full else None,
            "after": e.after if full else None,
        }
        for e in rows[:500]
    ]


def mark_people(events, people: list[dict]) -> list:
    """Each timeline event with `person` set: the audit row of the person whose request wrote it
    (same name, written within PAIRING), or None for the system's (scheduler, reconciler ...)."""
    marked = list(events)
    for e in marked:
        e.person = next(
            (p for p in people if p["actor"] == e.actor and abs(p["time"] - e.time) <= PAIRING),
            None,
        )
    return marked
