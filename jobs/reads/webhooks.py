"""Webhooks as the ledger holds them: which ones a user sees, and whose owner may still be told.

A webhook's owner is told about a job only while they may know (docs/ARCHITECTURE.md,
"Membership bounds a member's reach"): an active user who still admins the team (a team
webhook) or is still in the job's team (their own jobs'). The outbox asks `may_tell` when it
writes a delivery (`jobs.ledger.outbox`), the delivery loop asks `refusal` again at every try
(`jobs.loops.deliveries`), so someone removed or deactivated is told nothing more, not even
about their own jobs. Nothing here writes.
"""

from collections.abc import Callable, Iterable

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet

from jobs.errors import NotFound
from jobs.models import Job, Membership, Team, Webhook, WebhookDelivery

TEST_EVENT = "test"  # a test delivery's event: about no job


def visible_webhooks(user: User) -> QuerySet[Webhook]:
    """Webhooks the user may see and manage: their own, and those of the teams they admin
    (every one for staff)."""
    hooks = Webhook.objects.select_related("team", "owner").order_by("pk")
    if user.is_staff:
        return hooks
    admin_of = Membership.objects.filter(user=user, role=Membership.Role.ADMIN).values("team_id")
    return hooks.filter(Q(owner=user) | Q(team_id__in=admin_of))


def get_visible_webhook(user: User, webhook_id: int) -> Webhook:
    hook = visible_webhooks(user).filter(pk=webhook_id).first()
    if hook is None:
        raise NotFound(f"webhook {webhook_id} does not exist or is not yours")
    return hook


def may_tell(hooks: Iterable[Webhook], team_ids: set[int]) -> Callable[[Webhook, int], bool]:
    """Whether a webhook may still be told about a job of a team, read in two queries for
    these webhooks and teams. Its owner must be active; a team webhook's owner must still
    admin the team (or be staff), a personal one's still be in the job's team: someone who
    was removed, demoted or deactivated is told nothing more about the team's jobs, not even
    their own (whose reasons carry log lines)."""
    owners = {h.owner_id for h in hooks}
    users = {
        pk: (active, staff)
        for pk, active, staff in User.objects.filter(pk__in=owners).values_list(
            "pk", "is_active", "is_staff"
        )
    }
    roles = {
        (user_id, team_id): role
        for user_id, team_id, role in Membership.objects.filter(
            user_id__in=owners, team_id__in=team_ids
        ).values_list("user_id", "team_id", "role")
    }

    def allowed(hook: Webhook, team_id: int) -> bool:
        active, staff = users.get(hook.owner_id, (False, False))
        role = roles.get((hook.owner_id, team_id))
        if not active:
            return False
        if hook.team_id is not None:
            return staff or role == Membership.Role.ADMIN
        return role is not None

    return allowed


def refusal(delivery: WebhookDelivery) -> str:
    """Why this delivery may not be sent now ("" when it may), read at every try: the owner
    may have been removed from the job's team or deactivated since it was written."""
    hook = delivery.webhook
    if delivery.event == Webhook.Event.BUDGET:
        return _team_refusal(hook, (delivery.payload or {}).get("team"))
    if delivery.job_id is None or delivery.event == TEST_EVENT:
        return "" if hook.owner.is_active else "the webhook's owner is deactivated"
    team_id = Job.objects.filter(pk=delivery.job_id).values_list("team_id", flat=True).first()
    if team_id is None or may_tell([hook], {team_id})(hook, team_id):
        return ""  # a job deleted meanwhile: the delivery says so (job null)
    if not hook.owner.is_active:
        return "the webhook's owner is deactivated"
    if hook.team_id is not None:
        return "the webhook's owner no longer admins its team"
    return "the webhook's owner is no longer in the job's team"


def _team_refusal(hook: Webhook, team_name: object) -> str:
    """A team's budget alert (about no job): its owner must still be told about the team."""
    if not hook.owner.is_active:
        return "the webhook's owner is deactivated"
    team_id = Team.objects.filter(name=str(team_name)).values_list("pk", flat=True).first()
    if team_id is None:
        return "the team the alert is about is gone"
    if may_tell([hook], {team_id})(hook, team_id):
        return ""
    if hook.team_id is not None:
        return "the webhook's owner no longer admins its team"
    return "the webhook's owner is no longer in the team"
