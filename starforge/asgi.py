"""ASGI entry point: Django over HTTP, Channels websockets for the console's live pages."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")
django_app = get_asgi_application()

# After Django is set up: these import models.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from jobs.consumers import JobConsumer, JobListConsumer  # noqa: E402

websocket_urlpatterns = [
    path("ws/jobs/", JobListConsumer.as_asgi()),
    path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi()),
]

application = ProtocolTypeRouter(
    {
        "http": django_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
