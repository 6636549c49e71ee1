"""Helpers for the SCIM tests: a Django test client carrying the provisioning token, and the
bodies a SCIM client sends."""

import json
from typing import Any

from django.test import Client

SCIM_TOKEN = "scim-provisioning-test-token-0123456789"
USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
SCIM_TYPE = "application/scim+json"


class ScimClient:
    """Django's test client against /scim/v2/ with a bearer of our choosing."""

    def __init__(self, bearer: str | None = SCIM_TOKEN) -> None:
        extra = {"HTTP_AUTHORIZATION": f"Bearer {bearer}"} if bearer else {}
        self.client = Client(**extra)

    def get(self, path: str, **params: Any):
        return self.client.get(f"/scim/v2/{path}", params)

    def send(self, method: str, path: str, body: dict[str, Any]):
        call = getattr(self.client, method.lower())
        return call(f"/scim/v2/{path}", json.dumps(body), content_type=SCIM_TYPE)

    def delete(self, path: str):
        return self.client.delete(f"/scim/v2/{path}")


def user_body(username: str, **fields: Any) -> dict[str, Any]:
    return {
        "schemas": [USER_SCHEMA],
        "userName": username,
        "name": {"givenName": username.title(), "familyName": "Tester"},
        "emails": [{"value": f"{username}@example.org", "primary": True}],
        "active": True,
    } | fields


def patch(*operations: dict[str, Any]) -> dict[str, Any]:
    return {"schemas": [PATCH_SCHEMA], "Operations": list(operations)}
