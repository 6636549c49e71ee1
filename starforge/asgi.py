"""ASGI entry point: Django over HTTP; Channels routing for websockets comes with the console."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")
django_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (after Django is set up)

application = ProtocolTypeRouter({"http": django_app})
