"""The audit log's row (`AuditEntry`): one append-only row per change a person or a token made,
whatever the door (the API and the CLI, the console, the Django admin, SCIM, sign-in and out).

A row is never changed or removed by the application: `save` on an existing row, `delete`, and
a queryset's `update` and `delete` raise `AuditImmutable`; the admin is read-only; on PostgreSQL
a trigger (migration 0037) refuses UPDATE and DELETE too. The one path that removes rows is the
retention purge (`jobs.audit.purge`), which exports them first and sets, for its own
transaction only, the session variable the trigger lets through.

Who and what are kept as they were at the time (username, token prefix, a target's label and
team), never as foreign keys a later delete could cascade into or null out. `jobs.models`
imports this so that the app and every reader find it there; it imports nothing of the ledger.
"""

from django.db import models
from django.utils import timezone


class AuditImmutable(Exception):
    """An attempt to change or remove an audit row."""


def _refuse(what: str) -> None:
    raise AuditImmutable(f"the audit log is append-only: {what} refused")


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs):  # noqa: ARG002 - refused whatever it sets
        _refuse("update")

    def delete(self):
        _refuse("delete")

    update.queryset_only = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]


class AuditEntry(models.Model):
    """One change: who (and with which token), what, on what, from where, when."""

    time = models.DateTimeField(default=timezone.now, db_index=True)
    # The person: their id and username at the time (empty for a failed sign-in's unknown name).
    actor_id = models.IntegerField(null=True, blank=True, db_index=True)
    actor = models.CharField(max_length=150, blank=True)
    # The API token used, if any: its id and prefix (never its secret).
    token_id = models.IntegerField(null=True, blank=True)
    token = models.CharField(max_length=16, blank=True)
    door = models.CharField(max_length=16)  # api, console, admin, scim, sign-in, command
    action = models.CharField(max_length=64, db_index=True)  # e.g. job.stop, team.member.add
    target_type = models.CharField(max_length=32, blank=True)  # job, team, token, user, ...
    target_id = models.CharField(max_length=64, blank=True)
    target = models.CharField(max_length=200, blank=True)  # its label at the time
    # The team the target is or belongs to: whose admins read the row.
    team_id = models.IntegerField(null=True, blank=True, db_index=True)
    team = models.CharField(max_length=50, blank=True)
    before = models.JSONField(null=True, blank=True)  # the settings changed, as they were
    after = models.JSONField(null=True, blank=True)  # and as they became
    address = models.CharField(max_length=64, blank=True)  # jobs.addresses.client_address

    objects = AuditQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["team_id", "id"], name="audit_team_order")]
        verbose_name = "audit entry"
        verbose_name_plural = "audit log"

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor or '?'} {self.action} {self.target}"

    def save(self, *args, **kwargs) -> None:
        if not self._state.adding:
            _refuse(f"changing audit row {self.pk}")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        _refuse(f"deleting audit row {self.pk}")
