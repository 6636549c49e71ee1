"""Sign-in through the organisation's OpenID provider (issue 51, point 1), with
mozilla-django-oidc's authorization-code flow (PKCE, RS256 ID tokens checked against the
provider's keys). Configured by `SF_OIDC_*` (`jobs.oidc_config`, kept in `settings.SF_OIDC`);
without it this module answers 404 and the product signs in by password as before.

Who signs in: the person the provider's `sub` names (`jobs.identities.Identity.oidc_subject`).
At the first sign-in they are linked to a SCIM-provisioned account of the same user name, or
a new account is made; never to an account the IdP does not manage (a password user, staff),
so a provider cannot take over an account by naming it. OIDC never makes staff.

Teams: at every sign-in the groups claim is mapped (`SF_OIDC_GROUP_MAP`, IdP group ->
team:role) onto memberships of the teams the map names, the strongest role winning; a team
the map names whose groups the person lost is left through `provision_member`, so their
waiting work there stops (`jobs.signals`). Teams the map does not name are not touched.

Leavers: an account inactive here cannot sign in; a signed-in console session asks the
provider's userinfo endpoint again, with the access token of its sign-in, at its first request
after `recheck_s` (`SessionRecheck`, our own re-check rather than the library's
SessionRefresh, which re-runs the whole flow in the browser): a refusal ends the session.
"""

import logging
import time
from typing import Any

import requests
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from jobs.actions.teams import provision_member
from jobs.models import Identity, Team
from jobs.oidc_config import ROLES

log = logging.getLogger(__name__)
BY = "OIDC sign-in"
TOKEN_KEY = "sf_oidc_access_token"
CHECKED_KEY = "sf_oidc_checked_at"
FAILED_URL = "/accounts/login/?sso=failed"
TIMEOUT_S = 10


def config() -> dict[str, Any] | None:
    return getattr(settings, "SF_OIDC", None)


def _discovered(issuer: str) -> dict[str, Any]:
    """The provider's discovery document, kept an hour."""
    key = f"sf-oidc-discovery:{issuer}"
    doc = cache.get(key)
    if doc is None:
        answer = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=TIMEOUT_S)
        answer.raise_for_status()
        doc = answer.json()
        cache.set(key, doc, 3600)
    return doc


def endpoints(conf: dict[str, Any]) -> dict[str, str]:
    found = _discovered(conf["issuer"]) if conf["issuer"] else {}
    return {
        key: conf["endpoints"].get(key) or found[key]
        for key in ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")
    }


def library_settings(conf: dict[str, Any]) -> dict[str, Any]:
    """What mozilla-django-oidc reads, from our configuration."""
    points = endpoints(conf)
    return {
        "OIDC_RP_CLIENT_ID": conf["client_id"],
        "OIDC_RP_CLIENT_SECRET": conf["client_secret"],
        "OIDC_OP_AUTHORIZATION_ENDPOINT": points["authorization_endpoint"],
        "OIDC_OP_TOKEN_ENDPOINT": points["token_endpoint"],
        "OIDC_OP_USER_ENDPOINT": points["userinfo_endpoint"],
        "OIDC_OP_JWKS_ENDPOINT": points["jwks_uri"],
        "OIDC_RP_SIGN_ALGO": "RS256",
        "OIDC_RP_SCOPES": conf["scopes"],
        "OIDC_USE_PKCE": True,
        "OIDC_TIMEOUT": TIMEOUT_S,
        "OIDC_CREATE_USER": True,
        "LOGIN_REDIRECT_URL_FAILURE": FAILED_URL,
    }


def oidc_setting(attr: str, *default: Any) -> Any:
    conf = config()
    if conf is not None:
        mapped = library_settings(conf)
        if attr in mapped:
            return mapped[attr]
    return import_from_settings(attr, *default)


# -- the backend: who signs in, and their teams ---------------------------------------------


class Backend(OIDCAuthenticationBackend):
    """Authenticates the provider's callback; inert when OIDC is off (password sign-in goes
    on through Django's ModelBackend)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.UserModel = User  # sessions and permissions work as ModelBackend's either way
        if config() is not None:
            super().__init__(*args, **kwargs)

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        if config() is None or request is None or "code" not in request.GET:
            return None
        try:
            return super().authenticate(request, **kwargs)
        except requests.RequestException as exc:
            log.warning("OIDC sign-in failed at the provider: %s", exc)
            return None

    def get_user(self, user_id: Any) -> User | None:
        """As Django's ModelBackend: an inactive account's session no longer signs in."""
        user = User.objects.filter(pk=user_id).first()
        return user if user is not None and user.is_active else None

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return isinstance(claims.get("sub"), str) and 0 < len(claims["sub"]) <= 255

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        return User.objects.filter(identity__oidc_subject=claims["sub"])

    def create_user(self, claims: dict[str, Any]) -> User:
        with transaction.atomic():
            user = _scim_account(claims) or _new_account(claims)
            Identity.objects.update_or_create(user=user, defaults={"oidc_subject": claims["sub"]})
            log.info("OIDC: %s signed in for the first time as %s", claims["sub"], user.username)
            return self.update_user(user, claims)

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        if user.is_active:
            sync_teams(user, claims.get(config()["groups_claim"]))  # type: ignore[index]
        return user

    def store_tokens(self, access_token: str, id_token: str) -> None:
        self.request.session[TOKEN_KEY] = access_token
        self.request.session[CHECKED_KEY] = time.time()


def _claimed_name(claims: dict[str, Any]) -> str:
    name = claims.get("preferred_username") or claims.get("email") or claims["sub"]
    return str(name)[:150]


def _scim_account(claims: dict[str, Any]) -> User | None:
    """A SCIM-provisioned account not yet linked, by user name."""
    return User.objects.filter(
        username=_claimed_name(claims),
        identity__isnull=False,
        identity__oidc_subject__isnull=True,
        is_staff=False,
        is_superuser=False,
    ).first()


def _new_account(claims: dict[str, Any]) -> User:
    wanted = _claimed_name(claims)
    username = wanted
    suffix = 1
    while User.objects.filter(username=username).exists():  # someone else's name: not theirs
        suffix += 1
        username = f"{wanted[:140]}-{suffix}"
    email = claims.get("email") if isinstance(claims.get("email"), str) else ""
    # No password given: an unusable one, so this account signs in through the IdP only.
    return User.objects.create_user(username=username, email=(email or "")[:254])


def mapped_roles(groups: Any, group_map: dict[str, list[tuple[str, str]]]) -> dict[str, str | None]:
    """team -> the strongest role the person's groups give there, None for a team the map
    names that none of their groups reaches."""
    wanted: dict[str, str | None] = {
        team: None for places in group_map.values() for team, _ in places
    }
    names = [g for g in groups if isinstance(g, str)] if isinstance(groups, list) else []
    for group in names:
        for team, role in group_map.get(group, []):
            current = wanted[team]
            if current is None or ROLES.index(role) > ROLES.index(current):
                wanted[team] = role
    return wanted


def sync_teams(user: User, groups: Any) -> None:
    conf = config()
    assert conf is not None
    teams = {team.name: team for team in Team.objects.filter(name__in=_mapped_teams(conf))}
    for name, role in mapped_roles(groups, conf["group_map"]).items():
        team = teams.get(name)
        if team is None:
            log.warning("SF_OIDC_GROUP_MAP names team %s, which does not exist", name)
            continue
        provision_member(team, user, role, BY)


def _mapped_teams(conf: dict[str, Any]) -> set[str]:
    return {team for places in conf["group_map"].values() for team, _ in places}


# -- the views -----------------------------------------------------------------------------------


class SignInView(OIDCAuthenticationRequestView):
    """Sends the browser to the provider (404 while OIDC is off)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if config() is None:
            raise Http404("single sign-on is not configured on this server")
        super().__init__(*args, **kwargs)


class CallbackView(OIDCAuthenticationCallbackView):
    """The provider's answer: signs the person in, or back to the sign-in page saying why."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if config() is None:
            raise Http404("single sign-on is not configured on this server")
        return super().get(request)


def _sign_in(request: HttpRequest) -> HttpResponse:
    return SignInView.as_view()(request)


def _callback(request: HttpRequest) -> HttpResponse:
    return CallbackView.as_view()(request)


urlpatterns = [
    path("authenticate/", _sign_in, name="oidc_authentication_init"),
    path("callback/", _callback, name="oidc_authentication_callback"),
]


# -- the re-check and the sign-in page ------------------------------------------------------------


class SessionRecheck:
    """Ends a console session signed in through OIDC once the provider stops vouching for the
    person: at the first request after `recheck_s`, the userinfo endpoint is asked again with
    the sign-in's access token. The account inactive here ends it too."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        session = getattr(request, "session", None)
        if session is not None and TOKEN_KEY in session and not still_vouched(request):
            auth.logout(request)
            return HttpResponseRedirect(FAILED_URL.replace("failed", "ended"))
        return self.get_response(request)


def still_vouched(request: HttpRequest) -> bool:
    conf = config()
    session = request.session
    if conf is None or not request.user.is_active:
        return False
    if time.time() - session.get(CHECKED_KEY, 0) < conf["recheck_s"]:
        return True
    try:
        answer = requests.get(
            endpoints(conf)["userinfo_endpoint"],
            headers={"Authorization": f"Bearer {session[TOKEN_KEY]}"},
            timeout=TIMEOUT_S,
        )
    except requests.RequestException as exc:
        log.warning("OIDC re-check could not reach the provider, session kept: %s", exc)
        return True  # an unreachable provider is no verdict on the person
    if answer.status_code != 200:
        log.info("OIDC re-check: the provider no longer vouches for %s", request.user)
        return False
    session[CHECKED_KEY] = time.time()
    return True


def sign_in_options(request: HttpRequest) -> dict[str, Any]:
    """Template context: what the sign-in page offers."""
    conf = config()
    return {
        "oidc_sign_in": conf is not None,
        "oidc_name": conf["name"] if conf else "",
        "password_sign_in": getattr(settings, "SF_PASSWORD_LOGIN", True),
        "sso_outcome": request.GET.get("sso", "")[:10],
    }
