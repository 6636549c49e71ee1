"""SCIM 2.0 provisioning (RFC 7643, 7644) through django-scim2: the organisation's identity
provider creates, changes and deactivates users and keeps teams (SCIM groups) and their members
under `/scim/v2/` (`jobs.scim_urls` mounts the views).

Who may: only the provisioning token, `SF_SCIM_TOKEN` (`Authorization: Bearer <it>`); never a
user's API token nor a console session, staff's included. No token set: SCIM is off (401).

What it manages (`jobs.identities`): the users linked to the IdP (made here, or by an OIDC
sign-in) and never staff or superusers, which SCIM neither sees nor makes; every team, by its
id. A SCIM DELETE of a user deactivates it and unlinks it (404 from then on): the ledger keeps
the person its jobs name. Deactivation, whether by `active: false` or DELETE, is the user's
`is_active` saved through the ORM, so `jobs.signals` stops their waiting work as for every
other door; their API tokens are revoked too. Group members come and go through
`jobs.actions.teams.provision_member`, so a removal is a membership deleted like any other.

PATCH is done here rather than by django-scim2's partial handlers: each operation is applied to
the resource's own SCIM document, which is then read back as a PUT would be, so add, replace
and remove mean the same for every attribute the schemas below publish.
"""

import copy
import hmac
import json
import logging
import re
from typing import Any
from urllib.parse import urljoin

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator, validate_slug
from django.db import transaction
from django.db.models import ProtectedError, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django_scim import constants, exceptions
from django_scim.adapters import SCIMGroup, SCIMUser
from django_scim.models import SCIMServiceProviderConfig
from django_scim.schemas import ALL as LIBRARY_SCHEMAS

from jobs.actions.teams import provision_member
from jobs.models import ApiToken, GroupLink, Identity, Membership, Team
from jobs.schemas import text_fault

log = logging.getLogger(__name__)
BY = "SCIM provisioning"
USER_SCHEMA = constants.SchemaURI.USER
GROUP_SCHEMA = constants.SchemaURI.GROUP
SCHEMA_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Schema"
NAME_MAX = 150
TEAM_NAME_MAX = 50
EXTERNAL_ID_MAX = 255
MEMBERS_MAX = 10_000


# -- who may ------------------------------------------------------------------------------------


def _bearer(request: HttpRequest) -> str:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    return secret.strip() if scheme.lower() == "bearer" else ""


def provisioning_token_ok(request: HttpRequest) -> bool:
    """Whether the request carries the provisioning token (compared in constant time)."""
    expected = settings.SF_SCIM_TOKEN
    given = _bearer(request)
    return bool(expected) and bool(given) and hmac.compare_digest(given, expected)


def error_response(status: int, detail: str, scim_type: str | None = None) -> HttpResponse:
    body: dict[str, Any] = {"schemas": [constants.SchemaURI.ERROR], "status": str(status)}
    body["detail"] = detail
    if scim_type:
        body["scimType"] = scim_type
    return HttpResponse(json.dumps(body), status=status, content_type=constants.SCIM_CONTENT_TYPE)


class ProvisioningAuth:
    """django-scim2's AUTH_CHECK_MIDDLEWARE, wrapped around every SCIM view: the provisioning
    token or 401. It replaces the library's check, which would let any signed-in user in."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.SF_SCIM_TOKEN:
            return _unauthorized("SCIM provisioning is off on this server (no SF_SCIM_TOKEN)")
        if not provisioning_token_ok(request):
            return _unauthorized(
                "SCIM needs the provisioning token (Authorization: Bearer <SF_SCIM_TOKEN>); "
                "a user's API token or a console session is not one"
            )
        return self.get_response(request, *args, **kwargs)


def _unauthorized(detail: str) -> HttpResponse:
    response = error_response(401, detail)
    response["WWW-Authenticate"] = 'Bearer realm="starforge-scim"'
    return response


def base_location(request: HttpRequest | None = None, *args: Any, **kwargs: Any) -> str:
    """Where resources' `location`s point: the server the client asked."""
    if request is not None:
        return request.build_absolute_uri("/")
    return settings.SF_SCIM_BASE_URL


class ServiceProviderConfig(SCIMServiceProviderConfig):
    """What this server offers: PATCH, filters on userName and displayName; no passwords."""

    def to_dict(self) -> dict[str, Any]:
        doc = super().to_dict()
        doc["changePassword"] = {"supported": False}
        doc["filter"] = {"supported": True, "maxResults": 200}
        return doc


# What the schemas publish is what is kept: a client (scim2-tester's checks included) writes
# exactly these attributes and reads them back. (attribute -> its kept sub-attributes; "ro" is
# computed by the server.)
KEPT = {
    USER_SCHEMA: {
        "userName": {},
        "name": {"givenName": "rw", "familyName": "rw"},
        "displayName": "ro",
        "active": "always",  # every account is active or not: never unassigned
        "emails": {"value": "rw"},
        "groups": "ro",
    },
    GROUP_SCHEMA: {"displayName": "always", "members": {"value": "rw", "$ref": "rw", "type": "rw"}},
}


def schemas() -> list[dict[str, Any]]:
    """SCHEMAS_GETTER: the library's core schemas, User and Group cut to what is kept."""
    found = []
    for schema in LIBRARY_SCHEMAS:
        if schema["id"].startswith("urn:ietf:params:scim:schemas:extension:"):
            continue
        kept = KEPT.get(schema["id"])
        if kept is not None:
            schema = copy.deepcopy(schema)
            schema["attributes"] = [
                _kept_attribute(a, kept[a["name"]])
                for a in schema["attributes"]
                if a["name"] in kept
            ]
        found.append({"schemas": [SCHEMA_SCHEMA]} | schema)
    return found


def _kept_attribute(attribute: dict[str, Any], kept: Any) -> dict[str, Any]:
    if kept == "ro":
        return attribute | {"mutability": "readOnly"}
    if kept == "always":
        return attribute | {"required": True}
    subs = attribute.get("subAttributes")
    if subs and kept:
        attribute["subAttributes"] = [
            s | ({"mutability": "readOnly"} if kept[s["name"]] == "ro" else {})
            for s in subs
            if s["name"] in kept
        ]
    return attribute


# -- PATCH, as an edit of the resource's document ----------------------------------------------

FILTERED_PATH = re.compile(r'^(?P<attr>\w+)\[\s*value\s+eq\s+"(?P<value>[^"]*)"\s*\]$', re.I)


def apply_operations(doc: dict[str, Any], operations: Any, attributes: dict[str, str]) -> None:
    """Apply RFC 7644 PATCH operations to `doc`, whose writable top-level attributes are
    `attributes` (lower-cased name -> its spelling)."""
    if not isinstance(operations, list) or not operations:
        raise exceptions.BadRequestError("PATCH needs a non-empty Operations list")
    for operation in operations:
        if not isinstance(operation, dict):
            raise exceptions.BadRequestError("each PATCH operation is an object")
        op = str(operation.get("op", "")).lower()
        if op not in ("add", "replace", "remove"):
            raise exceptions.BadRequestError(f"unknown PATCH op {operation.get('op')!r}")
        path = operation.get("path")
        if path is not None and not isinstance(path, str):
            raise exceptions.BadRequestError("a PATCH path is a string")
        _apply(doc, op, path, operation.get("value"), attributes)


def _apply(
    doc: dict[str, Any], op: str, path: str | None, value: Any, attributes: dict[str, str]
) -> None:
    if not path:
        if op == "remove":
            raise exceptions.BadRequestError("a remove names its path", scim_type="noTarget")
        if not isinstance(value, dict):
            raise exceptions.BadRequestError("a PATCH without a path takes an object value")
        for key, item in value.items():
            _apply(doc, op, key, item, attributes)
        return
    path = strip_urn(path)
    filtered = FILTERED_PATH.match(path)
    if filtered:
        _apply_filtered(doc, op, _attribute(filtered["attr"], attributes), filtered["value"])
        return
    head, _, sub = path.partition(".")
    attr = _attribute(head, attributes)
    if sub:
        inner = doc.get(attr)
        inner = dict(inner) if isinstance(inner, dict) else {}
        _set(inner, op, sub, value)
        doc[attr] = inner
    else:
        _set(doc, op, attr, value)


def _set(doc: dict[str, Any], op: str, key: str, value: Any) -> None:
    if op == "remove":
        doc.pop(key, None)
    elif op == "add" and isinstance(doc.get(key), list) and isinstance(value, list):
        present = {_member_value(item) for item in doc[key]}
        doc[key] = doc[key] + [item for item in value if _member_value(item) not in present]
    else:
        doc[key] = value


def _apply_filtered(doc: dict[str, Any], op: str, attr: str, value: str) -> None:
    if op != "remove":
        raise exceptions.BadRequestError(
            f'only remove takes a filtered path ({attr}[value eq "..."])',
            scim_type="invalidPath",
        )
    items = doc.get(attr)
    if isinstance(items, list):
        doc[attr] = [item for item in items if _member_value(item) != value]


def _member_value(item: Any) -> Any:
    return item.get("value") if isinstance(item, dict) else item


def strip_urn(path: str) -> str:
    for urn in (USER_SCHEMA, GROUP_SCHEMA):
        if path.lower().startswith(urn.lower() + ":"):
            return path[len(urn) + 1 :]
    return path


def _attribute(name: str, attributes: dict[str, str]) -> str:
    attr = attributes.get(name.lower())
    if attr is None:
        raise exceptions.BadRequestError(
            f"{name!r} cannot be changed here; writable: {', '.join(sorted(attributes.values()))}",
            scim_type="invalidPath",
        )
    return attr


# -- values -------------------------------------------------------------------------------------


def _text(doc: dict[str, Any], key: str, limit: int, required: bool = False) -> str:
    value = doc.get(key)
    if value is None or value == "":
        if required:
            raise exceptions.BadRequestError(f"{key} is required", scim_type="invalidValue")
        return ""
    if not isinstance(value, str) or len(value) > limit or text_fault(value):
        raise exceptions.BadRequestError(
            f"{key} must be text of at most {limit} characters", scim_type="invalidValue"
        )
    return value


def _primary_email(value: Any) -> str:
    if value in (None, []):
        return ""
    if isinstance(value, dict):  # some IdPs send the primary address alone
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise exceptions.BadRequestError("emails is a list of objects", scim_type="invalidValue")
    chosen = sorted(value, key=lambda item: not item.get("primary"))[0]
    email = _text(chosen, "value", 254)
    if email:
        try:
            EmailValidator()(email)
        except ValidationError:
            raise exceptions.BadRequestError(
                f"{email!r} is not an email address", scim_type="invalidValue"
            ) from None
    return email


def _revoke_tokens(user: User) -> int:
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


# -- users --------------------------------------------------------------------------------------

USER_ATTRIBUTES = {
    name.lower(): name for name in ("userName", "name", "displayName", "emails", "active")
} | {"externalid": "externalId"}


def scim_users() -> QuerySet[User]:
    """The users SCIM sees: linked to the IdP, never staff or superusers."""
    return User.objects.filter(
        identity__isnull=False, is_staff=False, is_superuser=False
    ).select_related("identity")


class ScimUser(SCIMUser):
    """A Starforge user as a SCIM User."""

    id_field = "identity__scim_id"

    @classmethod
    def resource_type_dict(cls, request: HttpRequest | None = None) -> dict[str, Any]:
        return super().resource_type_dict(request) | {"endpoint": "/Users"}

    def __init__(self, obj: User, request: HttpRequest | None = None) -> None:
        super().__init__(obj, request)
        self._external_id: str | None = None

    @property
    def id(self) -> str:
        return self.obj.identity.scim_id

    @property
    def groups(self) -> list[dict[str, Any]]:
        memberships = Membership.objects.filter(user=self.obj).select_related("team")
        return [_group_ref(m.team, self.request) for m in memberships.order_by("team_id")]

    def to_dict(self) -> dict[str, Any]:
        user = self.obj
        doc: dict[str, Any] = {
            "schemas": [USER_SCHEMA],
            "id": self.id,
            "userName": user.username,
            "displayName": self.display_name,
            "active": user.is_active,
            "groups": self.groups,
            "meta": self.meta,
        }
        name = {"givenName": user.first_name, "familyName": user.last_name}
        if any(name.values()):
            doc["name"] = {key: value for key, value in name.items() if value}
        if user.email:
            doc["emails"] = [{"value": user.email}]
        if user.identity.external_id:
            doc["externalId"] = user.identity.external_id
        return doc

    def from_dict(self, d: dict[str, Any]) -> None:
        user = self.obj
        user.username = _text(d, "userName", NAME_MAX, required=True)
        name = d.get("name") or {}
        if not isinstance(name, dict):
            raise exceptions.BadRequestError("name is an object", scim_type="invalidValue")
        user.first_name = _text(name, "givenName", NAME_MAX)
        user.last_name = _text(name, "familyName", NAME_MAX)
        user.email = _primary_email(d.get("emails"))
        active = d.get("active", True if user.pk is None else user.is_active)
        if not isinstance(active, bool):
            raise exceptions.BadRequestError("active is true or false", scim_type="invalidValue")
        user.is_active = active
        self._external_id = _text(d, "externalId", EXTERNAL_ID_MAX)

    def save(self) -> None:
        user = self.obj
        # Whatever the body said, SCIM never makes staff: it has no attribute for it and the
        # row is reset here, so a staff flag cannot ride in on a crafted model either.
        user.is_staff = False
        user.is_superuser = False
        with transaction.atomic():
            clash = User.objects.filter(username=user.username).exclude(pk=user.pk)
            if clash.exists():
                raise exceptions.IntegrityError(
                    f"a user named {user.username!r} exists already", scim_type="uniqueness"
                )
            new = user.pk is None
            was_active = not new and User.objects.filter(pk=user.pk, is_active=True).exists()
            if new:
                user.set_unusable_password()  # signs in through the IdP, not by password
            user.save()
            if new:
                Identity.objects.create(user=user, external_id=self._external_id or "")
                user.refresh_from_db()
            elif self._external_id is not None:
                Identity.objects.filter(user=user).update(external_id=self._external_id)
                user.identity.external_id = self._external_id
            if was_active and not user.is_active:
                revoked = _revoke_tokens(user)
                log.info("SCIM deactivated %s; %d tokens revoked", user.username, revoked)

    def delete(self) -> None:
        """Deactivate and unlink: the person stays in the ledger, SCIM no longer sees them."""
        user = self.obj
        with transaction.atomic():
            if user.is_active:
                user.is_active = False
                user.save(update_fields=["is_active"])
            _revoke_tokens(user)
            Identity.objects.filter(user=user).delete()
        log.info("SCIM deleted %s: deactivated and unlinked", user.username)

    def handle_operations(self, operations: Any) -> None:
        doc = self.to_dict()
        apply_operations(doc, operations, USER_ATTRIBUTES)
        self.from_dict(doc)
        self.save()


# -- groups (teams) -----------------------------------------------------------------------------

GROUP_ATTRIBUTES = {"displayname": "displayName", "members": "members"} | {
    "externalid": "externalId"
}


def _group_ref(team: Team, request: HttpRequest | None) -> dict[str, Any]:
    path = reverse("scim:groups", kwargs={"uuid": str(team.pk)})
    return {
        "value": str(team.pk),
        "$ref": urljoin(base_location(request), path),
        "display": team.name,
    }


def _team_name(doc: dict[str, Any]) -> str:
    name = _text(doc, "displayName", TEAM_NAME_MAX, required=True)
    try:
        validate_slug(name)
    except ValidationError:
        raise exceptions.BadRequestError(
            f"displayName {name!r} is not a team name: letters, digits, _ and - only",
            scim_type="invalidValue",
        ) from None
    return name


def _member_users(value: Any) -> list[User]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MEMBERS_MAX:
        raise exceptions.BadRequestError("members is a list of objects", scim_type="invalidValue")
    ids = []
    for item in value:
        member = _member_value(item)
        if not isinstance(member, str) or len(member) > 36:
            raise exceptions.BadRequestError(
                "each member is an object whose value is a SCIM user's id",
                scim_type="invalidValue",
            )
        ids.append(member)
    users = list(scim_users().filter(identity__scim_id__in=ids))
    if len(users) != len(set(ids)):
        raise exceptions.BadRequestError(
            "a member is not a user this SCIM client provisioned", scim_type="invalidValue"
        )
    return users


class ScimGroup(SCIMGroup):
    """A team as a SCIM Group: its id is the team's, its members the SCIM-managed users in it
    (the team's other members are not the IdP's to list or remove)."""

    id_field = "pk"

    @classmethod
    def resource_type_dict(cls, request: HttpRequest | None = None) -> dict[str, Any]:
        return super().resource_type_dict(request) | {"endpoint": "/Groups"}

    def __init__(self, obj: Team, request: HttpRequest | None = None) -> None:
        super().__init__(obj, request)
        self._external_id: str | None = None
        self._members: list[User] | None = None

    @property
    def id(self) -> str:
        return str(self.obj.pk)

    @property
    def members(self) -> list[dict[str, Any]]:
        users = scim_users().filter(membership__team=self.obj).order_by("pk")
        return [
            {
                "value": user.identity.scim_id,
                "$ref": urljoin(
                    base_location(self.request),
                    reverse("scim:users", kwargs={"uuid": user.identity.scim_id}),
                ),
                "type": "User",
            }
            for user in users
        ]

    @property
    def meta(self) -> dict[str, Any]:
        return {"resourceType": self.resource_type, "location": self.location}

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schemas": [GROUP_SCHEMA],
            "id": self.id,
            "displayName": self.obj.name,
            "members": self.members,
            "meta": self.meta,
        }
        link = GroupLink.objects.filter(team=self.obj).first()
        if link is not None and link.external_id:
            doc["externalId"] = link.external_id
        return doc

    def from_dict(self, d: dict[str, Any]) -> None:
        self.obj.name = _team_name(d)
        self._members = _member_users(d.get("members"))
        self._external_id = _text(d, "externalId", EXTERNAL_ID_MAX)

    def save(self) -> None:
        team = self.obj
        with transaction.atomic():
            if Team.objects.filter(name=team.name).exclude(pk=team.pk).exists():
                raise exceptions.IntegrityError(
                    f"a team named {team.name!r} exists already", scim_type="uniqueness"
                )
            team.save()
            if self._external_id is not None:
                GroupLink.objects.update_or_create(
                    team=team, defaults={"external_id": self._external_id}
                )
            if self._members is not None:
                _set_members(team, self._members)

    def delete(self) -> None:
        team = self.obj
        try:
            with transaction.atomic():
                for membership in Membership.objects.filter(team=team).select_related("user"):
                    provision_member(team, membership.user, None, BY)
                team.delete()
        except ProtectedError:
            raise exceptions.IntegrityError(
                f"team {team.name} has jobs, so it is kept; staff delete it in the admin "
                "once its jobs are gone"
            ) from None

    def handle_operations(self, operations: Any) -> None:
        doc = self.to_dict()
        apply_operations(doc, operations, GROUP_ATTRIBUTES)
        self.from_dict(doc)
        self.save()


def _set_members(team: Team, wanted: list[User]) -> None:
    """The SCIM-managed members become `wanted`: new ones join as members, those already in
    keep their role, the others leave through the membership-removal path."""
    wanted_ids = {user.pk for user in wanted}
    current = {m.user_id: m for m in Membership.objects.filter(team=team, user__in=scim_users())}
    for user in wanted:
        if user.pk not in current:
            provision_member(team, user, Membership.Role.MEMBER, BY)
    for user_id, membership in current.items():
        if user_id not in wanted_ids:
            provision_member(team, membership.user, None, BY)
