"""OpenID Connect sign-in's configuration, read from the environment when the settings load
(standard library only, like the rest of what `starforge.settings` imports). A mistake stops
the start with a sentence rather than failing sign-ins later.

SF_OIDC_ISSUER           the provider's issuer URL; its endpoints are read from its discovery
                         document (/.well-known/openid-configuration) at the first sign-in
SF_OIDC_AUTHORIZATION_ENDPOINT, SF_OIDC_TOKEN_ENDPOINT, SF_OIDC_USERINFO_ENDPOINT,
SF_OIDC_JWKS_URI         or the endpoints themselves, all four (they win over discovery)
SF_OIDC_CLIENT_ID, SF_OIDC_CLIENT_SECRET   this server's client at the provider
SF_OIDC_SCOPES           default "openid email profile"
SF_OIDC_GROUPS_CLAIM     the claim that lists the person's groups (default "groups")
SF_OIDC_GROUP_MAP        JSON: IdP group -> "team:role" (or a list of them), e.g.
                         {"ml-admins": "vision:admin", "ml": ["vision:member", "nlp:viewer"]}
SF_OIDC_NAME             what the sign-in button calls the provider (default "single sign-on")
SF_OIDC_RECHECK_S        how often a signed-in console session asks the provider again that the
                         person is still allowed (default 60; 0: every request)
SF_PASSWORD_LOGIN=0      turns password sign-in off (the console and the admin); needs OIDC
"""

import json
from collections.abc import Mapping
from typing import Any

ROLES = ("viewer", "member", "admin")  # jobs.models.Membership.Role, weakest first
ENDPOINTS = {
    "authorization_endpoint": "SF_OIDC_AUTHORIZATION_ENDPOINT",
    "token_endpoint": "SF_OIDC_TOKEN_ENDPOINT",
    "userinfo_endpoint": "SF_OIDC_USERINFO_ENDPOINT",
    "jwks_uri": "SF_OIDC_JWKS_URI",
}


def oidc_from_environ(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The OIDC configuration, or None when none is set (sign-in by password only)."""
    issuer = env.get("SF_OIDC_ISSUER", "").strip().rstrip("/")
    endpoints = {key: env.get(name, "").strip() for key, name in ENDPOINTS.items()}
    client_id = env.get("SF_OIDC_CLIENT_ID", "").strip()
    if not (issuer or client_id or any(endpoints.values())):
        return None
    if not client_id:
        raise RuntimeError("SF_OIDC_CLIENT_ID is needed once OIDC is configured")
    if not issuer and not all(endpoints.values()):
        raise RuntimeError("OIDC needs SF_OIDC_ISSUER, or all of " + ", ".join(ENDPOINTS.values()))
    return {
        "issuer": issuer,
        "endpoints": {key: value for key, value in endpoints.items() if value},
        "client_id": client_id,
        "client_secret": env.get("SF_OIDC_CLIENT_SECRET", ""),
        "scopes": env.get("SF_OIDC_SCOPES", "").strip() or "openid email profile",
        "groups_claim": env.get("SF_OIDC_GROUPS_CLAIM", "").strip() or "groups",
        "group_map": parse_group_map(env.get("SF_OIDC_GROUP_MAP", "")),
        "name": env.get("SF_OIDC_NAME", "").strip() or "single sign-on",
        "recheck_s": _seconds(env.get("SF_OIDC_RECHECK_S", "")),
    }


def parse_group_map(raw: str) -> dict[str, list[tuple[str, str]]]:
    """SF_OIDC_GROUP_MAP: IdP group -> [(team, role)]."""
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise RuntimeError(f"SF_OIDC_GROUP_MAP is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise RuntimeError('SF_OIDC_GROUP_MAP is a JSON object: {"idp-group": "team:role"}')
    return {str(group): _places(group, places) for group, places in doc.items()}


def _places(group: str, places: Any) -> list[tuple[str, str]]:
    found = []
    for place in places if isinstance(places, list) else [places]:
        team, _, role = str(place).partition(":")
        if not team or role not in ROLES:
            raise RuntimeError(
                f"SF_OIDC_GROUP_MAP[{group!r}]: {place!r} is not team:role with a role of "
                + ", ".join(ROLES)
            )
        found.append((team, role))
    return found


def _seconds(raw: str) -> int:
    try:
        value = int(raw) if raw.strip() else 60
    except ValueError as exc:
        raise RuntimeError(f"SF_OIDC_RECHECK_S must be a whole number, got {raw!r}") from exc
    return max(value, 0)


def password_login(env: Mapping[str, str], oidc: dict[str, Any] | None) -> bool:
    on = env.get("SF_PASSWORD_LOGIN", "1").strip() != "0"
    if not on and oidc is None:
        raise RuntimeError("SF_PASSWORD_LOGIN=0 needs OIDC (SF_OIDC_*): nobody could sign in")
    return on
