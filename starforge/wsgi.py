"""WSGI entry point: every HTTP request (API, console pages, admin, static) in the web server's
worker processes (granian, one per core, each serving one request at a time; see
`starforge.serving`).

Once the application and every view and API schema are loaded, the objects they made are
frozen out of the garbage collector's reach: they live as long as the worker, and a full
collection walking them all stopped a worker for 90 to 320 ms under load on two cores, several
times a minute (the tail of `bench/http_bench.py`'s latencies); after the freeze one takes a
few milliseconds, over what requests leave behind.

`serve` is what the web server loads in each worker: the application, with the two things a
worker of that server needs that it does not do itself (see there).
"""

import ctypes
import ctypes.util
import gc
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable
from importlib import import_module

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")
os.environ["SF_SERVING"] = "wsgi"
application = get_wsgi_application()
import_module(settings.ROOT_URLCONF)  # every view and the API's schemas, loaded now
gc.collect()
gc.freeze()

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # linux/prctl.h

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


def serve() -> WSGIApp:
    """The application for one web server worker (granian's `--factory` target, called in the
    worker): it ends when its server process dies, and its requests carry no server
    environment."""
    _stop_with(_server_pid())
    return without_server_environment(application, dict(os.environ))


def _server_pid() -> int:
    """The web server's process id as it was when it started this worker. granian starts its
    workers as multiprocessing processes, whose record of their parent holds even once the
    parent is gone; getppid() would by then name whatever adopted the orphan (init), and a
    worker whose server was killed while the worker was still loading Django would take that
    for its server and go on serving its port."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid is not None else os.getppid()


def without_server_environment(app: WSGIApp, server_env: dict[str, str]) -> WSGIApp:
    """`app`, given each request's environ less the variables of `server_env`.

    granian starts every request's environ from a copy of the process environment (the CGI
    habit): SF_SECRET_KEY, DATABASE_URL with its password, the object store's keys would sit in
    `request.META`, where an error report or any code that echoes headers would carry them off,
    and a server variable named like a header (HTTP_PROXY) would read as one the client sent.
    What the request set is kept: a key whose value differs from the server's."""

    def wsgi(environ: dict, start_response: Callable) -> Iterable[bytes]:
        for key, value in server_env.items():
            if environ.get(key) == value:
                del environ[key]
        return app(environ, start_response)

    return wsgi


def _stop_with(parent: int) -> None:
    """Ask the kernel to end this worker when `parent` (its server process) dies
    (PR_SET_PDEATHSIG, SIGKILL): a server SIGKILLed, or killed by the OOM killer, would
    otherwise leave its workers serving its port unsupervised. A server that died before this
    was set (while the worker loaded Django) is caught by the check after it."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("cannot ask to end with the web server: %s", os.strerror(ctypes.get_errno()))
    if os.getppid() != parent:
        os._exit(1)
