"""A user's API tokens as the tokens page and `/api/v1/tokens` list them. Creating and
revoking them is `jobs.actions.tokens`; nothing here writes."""

from django.contrib.auth.models import User
from django.db.models import QuerySet

from jobs.models import ApiToken


def user_tokens(user: User) -> QuerySet[ApiToken]:
    """The user's tokens, newest first, revoked and expired ones included."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-pk")
