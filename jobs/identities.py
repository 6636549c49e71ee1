"""Who a user is at the organisation's identity provider (issue 51, points 1 and 2): the
`Identity` that links a Starforge user to the IdP, made by SCIM provisioning (`jobs.scim`) or by
a first OpenID Connect sign-in (`jobs.oidc`).

A user with an identity is the IdP's to manage: SCIM lists, changes and deactivates it, OIDC
signs it in by its subject. A user without one (made in the admin, the embedded default's demo
user) is invisible to SCIM and signs in by password only. Staff and superusers are never
managed through SCIM whatever their rows say. `jobs.models` imports this so the app and every
reader find the model there.
"""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


def new_scim_id() -> str:
    return str(uuid.uuid4())


class Identity(models.Model):
    """A user's link to the IdP. Deleting it (a SCIM DELETE, which also deactivates the user)
    unlinks the account: SCIM answers 404 for it from then on and the ledger keeps the user."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="identity"
    )
    # The resource id SCIM clients address the user by (RFC 7643 section 3.1): opaque, stable.
    scim_id = models.CharField(max_length=36, unique=True, default=new_scim_id)
    # The IdP's own id for the user, as its SCIM client sent it (`externalId`).
    external_id = models.CharField(max_length=255, blank=True, default="")
    # The OpenID provider's `sub` claim: who signs in, whatever their email or user name says.
    oidc_subject = models.CharField(max_length=255, null=True, blank=True, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"identity of user {self.user_id}"


class GroupLink(models.Model):
    """What the IdP's SCIM client said of a team it provisions as a group: its own id for it.
    Every team is a SCIM group (addressed by the team's id); this row exists once a client
    sent an `externalId`."""

    team = models.OneToOneField(
        "jobs.Team", on_delete=models.CASCADE, primary_key=True, related_name="group_link"
    )
    external_id = models.CharField(max_length=255, blank=True, default="")

    def __str__(self) -> str:
        return f"SCIM group link of team {self.team_id}"
