"""ASGI entry point: Channels websockets for the console's live pages (and Django over HTTP, for
a deployment that routes HTTP here too; `make run` and production serve HTTP from granian,
`starforge.wsgi`)."""

import logging
import os
from urllib.parse import SplitResult, urlsplit

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")
django_app = get_asgi_application()

# After Django is set up: these import models.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import WebsocketDenier  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402
from django.urls import path  # noqa: E402

from jobs.console.consumers import JobConsumer, JobListConsumer  # noqa: E402

log = logging.getLogger(__name__)

Origin = tuple[str, str, int]  # scheme, host, port: what "same origin" compares
DEFAULT_PORTS = {"http": 80, "https": 443}


class SameOriginValidator:
    """Websocket handshakes only from the console's own pages.

    A browser sends the session cookie with a websocket handshake whatever page opens it, and
    the page's origin with it: without this check any site a signed-in user visits could read
    their job pages (cross-site websocket hijacking). The Origin must equal the console's own
    origin as the handshake reached this server, exactly (scheme: wss is https; the Host
    header's name and port, or, where this server has a port of its own (SF_WS_PORT), that
    name with the port the console's pages are served on, SF_PORT, and no other), with that
    Host in ALLOWED_HOSTS as for any request; or be listed in SF_ALLOWED_ORIGINS (or,
    exactly, in CSRF_TRUSTED_ORIGINS) for a proxy that rewrites Host. No Origin header is
    refused too: browsers always send one, and the CLI reads over HTTP.
    """

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if same_origin(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)


def same_origin(scope: dict) -> bool:
    origins = _header_values(scope, b"origin")
    hosts = _header_values(scope, b"host")
    origin = _parsed(origins[0], header=True) if len(origins) == 1 else None
    if origin is not None and (origin in _configured_origins() or origin == _own(scope, hosts)):
        return True
    log.warning("websocket refused: origin %.100r does not match host %.100r", origins, hosts)
    return False


def _own(scope: dict, hosts: list[str]) -> Origin | None:
    """The origin a console page has when its browser reached this server at this Host."""
    if len(hosts) != 1:
        return None
    domain, _ = split_domain_port(hosts[0])
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:  # as Django's HttpRequest.get_host
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    if not domain or not validate_host(domain, allowed):
        return None
    own = _parsed(f"{_page_scheme(scope)}://{hosts[0]}", header=True)
    if own is None or settings.SF_WS_PORT is None:
        return own
    # This server takes websockets on a port of its own; the pages come from the web server.
    if own[2] != settings.SF_WS_PORT:
        return None
    return own[0], own[1], settings.SF_PORT


def _page_scheme(scope: dict) -> str:
    """https when the handshake came over TLS, as the server or a trusted proxy says."""
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:  # the same trust Django gives it for HTTP requests
        name, secure_value = proxy_header
        header = name.removeprefix("HTTP_").replace("_", "-").lower().encode()
        values = _header_values(scope, header)
        if values:
            return "https" if values[0].split(",", 1)[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme", "ws") in ("wss", "https") else "http"


def _configured_origins() -> set[Origin]:
    listed = getattr(settings, "SF_ALLOWED_ORIGINS", [])
    if isinstance(listed, str):
        listed = listed.split(",")
    trusted = [o for o in getattr(settings, "CSRF_TRUSTED_ORIGINS", []) if "*" not in o]
    parsed = (_parsed(value.strip(), header=False) for value in [*listed, *trusted])
    return {origin for origin in parsed if origin is not None}


def _parsed(value: str, header: bool) -> Origin | None:
    """scheme://host[:port] as (scheme, host, port); None for anything else.

    A header is exactly that; a configured origin may end with a slash.
    """
    try:
        url: SplitResult = urlsplit(value)
        port = url.port
    except ValueError:
        return None
    extra = url.path if header else url.path.rstrip("/")
    if url.scheme not in DEFAULT_PORTS or not url.hostname or url.netloc.count("@"):
        return None
    if extra or url.query or url.fragment or value.endswith(("?", "#")):
        return None
    return url.scheme, url.hostname, DEFAULT_PORTS[url.scheme] if port is None else port


def _header_values(scope: dict, name: bytes) -> list[str]:
    return [value.decode("latin1") for key, value in scope.get("headers", []) if key == name]


websocket_urlpatterns = [
    path("ws/jobs/", JobListConsumer.as_asgi()),
    path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi()),
]

application = ProtocolTypeRouter(
    {
        "http": django_app,
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
