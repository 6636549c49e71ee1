"""How Starforge is served: HTTP by granian, websockets by the ASGI server, side by side.

Every HTTP request (API, console pages, admin, static) goes to granian's WSGI workers running
`starforge.wsgi`: one process per core (SF_WEB_WORKERS), each serving two requests at once on
threads of its own (SF_WEB_THREADS), which keep their database connections; granian's own
threads (Rust, outside the GIL) accept the connections, parse HTTP and keep connections alive.
Under ASGI the same sync views paid a thread hop per request and shared one process. Few
threads per process: threads of one process take turns at the GIL, and more processes than
cores, or more threads, raised the API mix's p99 under 50 connections (`bench/http_bench.py`).
gunicorn's sync workers, which served HTTP before, spent about as much CPU on each connection
(HTTP parsed in Python, a connection per request) as a job read itself: on two cores a job read
under granian serves about twice as many requests a second, the API mix about 1.4 to 1.5
times (`bench/RESULTS.md`).

A request in progress holds one of its worker's threads, so nothing here waits: under WSGI a
log follow is answered at once with when to ask again (SF_LOG_FOLLOW_HOLD_S). A download
streams for as long as the client reads (granian has no per-request timeout); in production
the proxy in front buffers it. The console's live pages keep their websockets on the ASGI
server (`starforge.asgi`, uvicorn), which `manage.py runstack` starts on a port of its own
(SF_WS_PORT); in production a proxy routes /ws/ to it on the site's own origin instead.

The argv builders are the one place both commands are spelled: `runstack`, the end-to-end
stack and the HTTP benchmark start exactly these.
"""

import sys

from django.conf import settings
from django.http import HttpRequest

# A worker told to stop (a restart, a shutdown) has this long to finish what it serves.
WORKER_KILL_S = 10


def web_server_argv(host: str, port: int, workers: int) -> list[str]:
    """granian serving every HTTP request from `workers` processes of SF_WEB_THREADS threads."""
    return [
        sys.executable,
        "-m",
        "granian",
        "--interface",
        "wsgi",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--blocking-threads",
        str(settings.SF_WEB_THREADS),
        "--runtime-threads",
        "1",
        "--no-ws",
        "--respawn-failed-workers",
        "--workers-kill-timeout",
        str(WORKER_KILL_S),
        "--log-level",
        "warning",
        "--factory",
        "starforge.wsgi:serve",
    ]


def websocket_server_argv(host: str, port: int) -> list[str]:
    """uvicorn serving the console's websockets (`starforge.asgi`)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "starforge.asgi:application",
        "--host",
        host,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def websocket_port(request: HttpRequest) -> dict[str, int | None]:
    """Template context: the port the page opens its websockets on (None: its own origin)."""
    return {"sf_websocket_port": settings.SF_WS_PORT}
