"""Who may still watch a stream: every change that can take one away tells the user's pages.

A membership row saved or deleted by any path (team API, console, the admin's inline, a cascade
from a deleted team or user), a user saved (deactivated, staff flag cleared, password changed),
a sign-out: each publishes to the user's group after commit (`jobs.broadcast`), and their open
consumers check again at once (`jobs.console.consumers`). What no signal sees (an UPDATE or
DELETE in SQL, a session that expires) the consumers catch on their periodic re-check.
"""

from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import HttpRequest

from jobs import broadcast
from jobs.models import Membership


@receiver(post_save, sender=Membership, dispatch_uid="jobs.membership_saved")
@receiver(post_delete, sender=Membership, dispatch_uid="jobs.membership_deleted")
def membership_row_changed(sender: type, instance: Membership, **kwargs) -> None:
    broadcast.publish_membership_changed(instance.user_id)


@receiver(post_save, sender=User, dispatch_uid="jobs.user_saved")
def user_saved(
    sender: type, instance: User, created: bool, update_fields: frozenset | None, **kwargs
) -> None:
    # A sign-in saves last_login alone: that takes nothing away.
    if not created and update_fields != frozenset({"last_login"}):
        broadcast.publish_user_changed(instance.pk)


@receiver(user_logged_out, dispatch_uid="jobs.signed_out")
def signed_out(sender: type, request: HttpRequest | None, user: User | None, **kwargs) -> None:
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if user is not None and session_key:
        broadcast.publish_session_ended(user.pk, session_key)
