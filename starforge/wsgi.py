"""WSGI entry point: every HTTP request (API, console pages, admin, static) in gunicorn's sync
workers, one process per core.

Sync Django under ASGI pays a thread hop per request and one process for all of them; a sync
worker runs the view on its own thread and keeps its database connection between requests.
The console's websockets stay on the ASGI server (`starforge.asgi`), which `manage.py runstack`
starts beside gunicorn (see `starforge.settings`, serving).
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")
# Read by the settings: a sync worker keeps its database connection between requests.
os.environ["SF_SERVING"] = "wsgi"
application = get_wsgi_application()
