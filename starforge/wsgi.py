"""WSGI entry point: every HTTP request (API, console pages, admin, static) in gunicorn's sync
workers, one process per core.

Sync Django under ASGI pays a thread hop per request and one process for all of them; a sync
worker runs the view on its own thread and keeps its database connection between requests.
The console's websockets stay on the ASGI server (`starforge.asgi`), which `manage.py runstack`
starts beside gunicorn (see `starforge.settings`, serving).

Once the application and every view and API schema are loaded, the objects they made are
frozen out of the garbage collector's reach: they live as long as the worker, and a full
collection walking them all stopped a worker for 90 to 320 ms under load on two cores, several
times a minute (the tail of `bench/http_bench.py`'s latencies); after the freeze one takes a
few milliseconds, over what requests leave behind.
"""

import gc
import os
from importlib import import_module

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")
# Read by the settings: a sync worker keeps its database connection between requests.
os.environ["SF_SERVING"] = "wsgi"
application = get_wsgi_application()
import_module(settings.ROOT_URLCONF)  # every view and the API's schemas, loaded now
gc.collect()
gc.freeze()
