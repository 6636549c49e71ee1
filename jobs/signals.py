"""What follows from a change of who may do what, whichever door the change came through.

Streams: a membership row saved or deleted by any path (team API, console, the admin's inline, a
cascade from a deleted team or user), a user saved (deactivated, staff flag cleared, password
changed), a sign-out: each publishes to the user's group after commit (`jobs.broadcast`), and
their open consumers check again at once (`jobs.console.consumers`). What no signal sees (an
UPDATE or DELETE in SQL, a session that expires) the consumers catch on their periodic re-check.

Work: a membership deleted or a user deactivated stops that person's waiting work in the team
(every team, for a deactivation) in the same transaction (`jobs.ledger.departures`). Signals
and not a verb, because every door saves through the ORM, Django's own user admin and a future
SCIM endpoint included; what no signal sees, the scheduler's admission re-check catches.
"""

from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver
from django.http import HttpRequest

from jobs import broadcast
from jobs.ledger import departures
from jobs.models import Membership

DEACTIVATING = "_sf_deactivating"  # set on a User by pre_save for its post_save


@receiver(post_save, sender=Membership, dispatch_uid="jobs.membership_saved")
@receiver(post_delete, sender=Membership, dispatch_uid="jobs.membership_deleted")
def membership_row_changed(sender: type, instance: Membership, **kwargs) -> None:
    broadcast.publish_membership_changed(instance.user_id)


@receiver(post_delete, sender=Membership, dispatch_uid="jobs.membership_ended")
def membership_ended(sender: type, instance: Membership, **kwargs) -> None:
    departures.member_left(instance.user_id, instance.team_id)


@receiver(pre_save, sender=User, dispatch_uid="jobs.user_saving")
def user_saving(sender: type, instance: User, update_fields: frozenset | None, **kwargs) -> None:
    # Read before the row is overwritten: the work stops once, when the account goes from
    # active to inactive, and not again at every later save of an inactive account.
    deactivating = (
        instance.pk is not None
        and not instance.is_active
        and (update_fields is None or "is_active" in update_fields)
        and User.objects.filter(pk=instance.pk, is_active=True).exists()
    )
    setattr(instance, DEACTIVATING, deactivating)


@receiver(post_save, sender=User, dispatch_uid="jobs.user_saved")
def user_saved(
    sender: type, instance: User, created: bool, update_fields: frozenset | None, **kwargs
) -> None:
    if getattr(instance, DEACTIVATING, False):
        setattr(instance, DEACTIVATING, False)
        departures.user_deactivated(instance.pk)
    # A sign-in saves last_login alone: that takes nothing away.
    if not created and update_fields != frozenset({"last_login"}):
        broadcast.publish_user_changed(instance.pk)


@receiver(user_logged_out, dispatch_uid="jobs.signed_out")
def signed_out(sender: type, request: HttpRequest | None, user: User | None, **kwargs) -> None:
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if user is not None and session_key:
        broadcast.publish_session_ended(user.pk, session_key)
