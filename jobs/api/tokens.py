"""The tokens API (`/api/v1/tokens`): a user creates, lists and revokes their own API tokens.

Only a user's credential opens it (an API token or the console session), never a job token. A
token created with a token is that token's child: it cannot outlive it, and revoking a token
revokes its children (`jobs.actions.tokens`).
"""

import datetime as dt

from django.views.decorators.cache import never_cache
from ninja import Router, Schema, Status
from ninja.decorators import decorate_view
from pydantic import Field

from jobs import auth
from jobs.actions import tokens
from jobs.auth import ConsoleSession, UserToken
from jobs.models import ApiToken
from jobs.reads.tokens import user_tokens
from jobs.schemas import ErrorOut, Text

# Same doors as the jobs API: a token for the CLI, the session (CSRF-checked) for the console.
router = Router(auth=[UserToken(), ConsoleSession()], tags=["tokens"])


class TokenIn(Schema):
    # Lengths and ranges are checked by `tokens.create_token`, so the console gets the same
    # sentences.
    name: Text = "cli"
    expires_in_days: int | None = Field(
        None,
        description="1..3650, and no later than the creating token's expiry; omit for no expiry, "
        "or, when a token that expires creates it, for that token's expiry",
    )


class TokenOut(Schema):
    id: int
    name: str
    prefix: str = Field(description="the secret's first characters, to tell tokens apart")
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None


class NewTokenOut(TokenOut):
    secret: str = Field(description="shown in this answer only; the server keeps its sha256")


def token_out(row: ApiToken) -> dict:
    return {
        "id": row.pk,
        "name": row.name,
        "prefix": row.prefix,
        "created_at": row.created_at,
        "last_used_at": row.last_used_at,
        "expires_at": row.expires_at,
        "revoked_at": row.revoked_at,
    }


@router.get(
    "/tokens",
    response={200: list[TokenOut], (401, 429): ErrorOut},
    summary="My API tokens, newest first",
)
def list_tokens(request):
    return [token_out(row) for row in user_tokens(request.auth)]


@router.post(
    "/tokens",
    response={201: NewTokenOut, (400, 401, 413, 422, 429): ErrorOut},
    summary="Create an API token",
)
@decorate_view(never_cache)  # the answer holds the secret
def create_token(request, data: TokenIn):
    creator = auth.request_token(request)
    row, secret = tokens.create_token(request.auth, data.name, data.expires_in_days, creator)
    return Status(201, {**token_out(row), "secret": secret})


@router.delete(
    "/tokens/{token_id}",
    response={204: None, (401, 404, 422, 429): ErrorOut},
    summary="Revoke one of my tokens and every token created with it",
)
def revoke_token(request, token_id: int):
    tokens.revoke_token(request.auth, token_id)
    return Status(204, None)
