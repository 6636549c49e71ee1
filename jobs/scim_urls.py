"""The `/scim/v2/` URL conf: django-scim2's views, narrowed to what `jobs.scim` manages (the
IdP's users, never staff; teams by their id) and answering 404, never 500, for an id that is no
resource's. Kept apart from `jobs.scim` because django-scim2's views read its settings, which
name `jobs.scim`, when they are imported."""

import json
from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt
from django_scim import exceptions, views
from django_scim.filters import FilterQuery, UserFilterQuery
from scim2_filter_parser.parser import SCIMParserError

from jobs.models import Team
from jobs.schemas import text_fault
from jobs.scim import ProvisioningAuth, error_response, scim_users, strip_urn

ID_MAX = 36


def _team_model() -> type[Team]:
    return Team


class TeamFilterQuery(FilterQuery):
    model_getter = _team_model
    attr_map = {("displayName", None, None): "name"}

    @classmethod
    def table_name(cls) -> str:
        return Team._meta.db_table


ALWAYS = {"id", "schemas", "meta"}


def _names(raw: Any) -> list[str]:
    if isinstance(raw, str):
        raw = raw.split(",")
    if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
        raise exceptions.BadRequestError("attributes are a list of attribute names")
    return [strip_urn(name.strip()) for name in raw if name.strip()][:100]


def project(doc: dict[str, Any], attributes: list[str], excluded: list[str]) -> dict[str, Any]:
    """`doc` with only `attributes`, or without `excluded` (RFC 7644 section 3.4.2.5); id,
    schemas and meta are always returned."""
    keys = {key.lower(): key for key in doc}
    if attributes:
        kept = {key: doc[key] for key in ALWAYS if key in doc}
        for name in attributes:
            head, _, sub = name.partition(".")
            key = keys.get(head.lower())
            if key is None:
                continue
            if sub and isinstance(doc[key], dict):
                inner = {k: v for k, v in doc[key].items() if k.lower() == sub.lower()}
                kept[key] = (
                    kept.get(key, {}) | inner if isinstance(kept.get(key, {}), dict) else inner
                )
            else:
                kept[key] = doc[key]
        return kept
    projected = dict(doc)
    for name in excluded:
        head, _, sub = name.partition(".")
        key = keys.get(head.lower())
        if key is None or key in ALWAYS:
            continue
        if sub and isinstance(projected[key], dict):
            projected[key] = {k: v for k, v in projected[key].items() if k.lower() != sub.lower()}
        else:
            projected.pop(key, None)
    return projected


def projected(response: HttpResponse, attributes: Any, excluded: Any) -> HttpResponse:
    if response.status_code != 200 or not (attributes or excluded):
        return response
    included, left_out = _names(attributes or []), _names(excluded or [])
    doc = json.loads(response.content)
    if "Resources" in doc:
        doc["Resources"] = [project(r, included, left_out) for r in doc["Resources"]]
    else:
        doc = project(doc, included, left_out)
    response.content = json.dumps(doc)
    return response


class _Narrowed:
    """GET by id and lists over `visible()` alone; filters parsed by django-scim2, then
    narrowed the same way."""

    kwargs: dict[str, Any]
    filter_query: type[FilterQuery]

    def visible(self) -> QuerySet:
        raise NotImplementedError

    def find(self, key: str) -> Any:
        raise NotImplementedError

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = super().get(request, *args, **kwargs)  # type: ignore[misc]
        return projected(
            response, request.GET.get("attributes"), request.GET.get("excludedAttributes")
        )

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = super().post(request, *args, **kwargs)  # type: ignore[misc]
        if not request.path.endswith("/.search"):
            return response
        body = json.loads(request.body or b"{}")
        return projected(response, body.get("attributes"), body.get("excludedAttributes"))

    def load_body(self, body: bytes) -> dict[str, Any]:
        doc = super().load_body(body)  # type: ignore[misc]
        if not isinstance(doc, dict):
            raise exceptions.BadRequestError("the body is a JSON object")
        return doc

    def get_object(self) -> Any:
        key = self.kwargs.get("uuid") or ""
        found = self.find(key) if len(key) <= ID_MAX and not text_fault(key) else None
        if found is None:
            raise exceptions.NotFoundError(key[:ID_MAX])
        return found

    def get_many(self, request: HttpRequest) -> HttpResponse:
        query = request.GET.get("filter")
        if query:
            return self._search(request, query, *self._page(request))  # type: ignore[attr-defined]
        return self._build_response(  # type: ignore[attr-defined]
            request,
            self.visible().order_by("pk"),
            *self._page(request),  # type: ignore[attr-defined]
        )

    def _search(self, request: HttpRequest, query: str, start: int, count: int) -> HttpResponse:
        if len(query) > 1000:
            raise exceptions.BadRequestError("a filter is at most 1000 characters")
        try:
            found = [row.pk for row in self.filter_query.search(query, request)]
        except (ValueError, SCIMParserError) as e:
            raise exceptions.BadRequestError(f"invalid filter: {e}") from None
        rows = self.visible().filter(pk__in=found).order_by("pk")
        return self._build_response(request, rows, start, count)  # type: ignore[attr-defined]


class UsersView(_Narrowed, views.UsersView):
    filter_query = UserFilterQuery

    def visible(self) -> QuerySet[User]:
        return scim_users()

    def find(self, key: str) -> User | None:
        return scim_users().filter(identity__scim_id=key).first()


class GroupsView(_Narrowed, views.GroupsView):
    filter_query = TeamFilterQuery

    def visible(self) -> QuerySet[Team]:
        return Team.objects.all()

    def find(self, key: str) -> Team | None:
        return Team.objects.filter(pk=int(key)).first() if key.isdecimal() else None


class UserSearchView(_Narrowed, views.UserSearchView):
    filter_query = UserFilterQuery

    def visible(self) -> QuerySet[User]:
        return scim_users()


class GroupSearchView(_Narrowed, views.GroupSearchView):
    filter_query = TeamFilterQuery

    def visible(self) -> QuerySet[Team]:
        return Team.objects.all()


class _Listed:
    """django-scim2's discovery lists lack `totalResults` (RFC 7644 section 3.4.2) and its
    unknown ids answer 404 with no SCIM error body: both are mended here."""

    def get(self, request: HttpRequest, uuid: str | None = None, *args: Any, **kwargs: Any):
        response = super().get(request, uuid, *args, **kwargs)  # type: ignore[misc]
        if response.status_code == 404:
            return error_response(404, f"no such resource: {(uuid or '')[:ID_MAX]!r}")
        if uuid is None:
            doc = json.loads(response.content)
            doc["totalResults"] = len(doc["Resources"])
            doc["itemsPerPage"] = len(doc["Resources"])
            doc["startIndex"] = 1
            response.content = json.dumps(doc)
        return response


class ResourceTypesView(_Listed, views.ResourceTypesView):
    pass


class SchemasView(_Listed, views.SchemasView):
    pass


def not_implemented(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    return error_response(
        501, "not offered here: /Users and /Groups (and their /.search) are, Bulk and Me not"
    )


def unknown_endpoint(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    return error_response(404, f"no SCIM endpoint at {request.path[:200]!r}")


_not_offered = csrf_exempt(ProvisioningAuth(not_implemented))
_unknown = csrf_exempt(ProvisioningAuth(unknown_endpoint))

urlpatterns = [
    re_path(r"^$", _not_offered, name="root"),
    re_path(r"^\.search$", _not_offered, name="search"),
    re_path(r"^Users/\.search$", UserSearchView.as_view(), name="users-search"),
    re_path(r"^Users(?:/(?P<uuid>[^/]+))?$", UsersView.as_view(), name="users"),
    re_path(r"^Groups/\.search$", GroupSearchView.as_view(), name="groups-search"),
    re_path(r"^Groups(?:/(?P<uuid>[^/]+))?$", GroupsView.as_view(), name="groups"),
    re_path(r"^Me$", _not_offered, name="me"),
    re_path(
        r"^ServiceProviderConfig$",
        views.ServiceProviderConfigView.as_view(),
        name="service-provider-config",
    ),
    re_path(
        r"^ResourceTypes(?:/(?P<uuid>[^/]+))?$",
        ResourceTypesView.as_view(),
        name="resource-types",
    ),
    re_path(r"^Schemas(?:/(?P<uuid>[^/]+))?$", SchemasView.as_view(), name="schemas"),
    re_path(r"^Bulk$", _not_offered, name="bulk"),
    re_path(r"^.*$", _unknown),
]
