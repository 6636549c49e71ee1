"""How Starforge is served: HTTP by gunicorn, websockets by the ASGI server, side by side.

Every HTTP request (API, console pages, admin, static) goes to gunicorn's sync workers running
`starforge.wsgi`: one request at a time per process, on the process's own thread, which keeps
its database connection. Under ASGI the same sync views paid a thread hop per request and
shared one process. Sync workers, not threads: threads of one process take turns at the GIL,
which doubled the p99 of a job read under 50 connections (`bench/http_bench.py`). A worker
waiting (`sf job logs` long-polls up to 30 s) is a worker taken, hence SF_WEB_WORKERS of at
least 4 by default, even on fewer cores. The console's live pages keep their websockets on
the ASGI server (`starforge.asgi`, uvicorn), which `manage.py runstack` starts on a port of its
own (SF_WS_PORT); in production a proxy routes /ws/ to it on the site's own origin instead.

The argv builders are the one place both commands are spelled: `runstack`, the end-to-end
stack and the HTTP benchmark start exactly these.
"""

import sys

from django.conf import settings
from django.http import HttpRequest

# A request still running after this many seconds is cut off and its worker replaced (a log
# download streams for as long as the client reads).
WEB_TIMEOUT_S = 300


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def web_server_argv(host: str, port: int, workers: int) -> list[str]:
    """gunicorn serving every HTTP request from `workers` sync worker processes."""
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "starforge.wsgi:application",
        "--bind",
        _bind(host, port),
        "--workers",
        str(workers),
        "--worker-class",
        "sync",
        "--timeout",
        str(WEB_TIMEOUT_S),
        "--graceful-timeout",
        "10",
        "--log-level",
        "warning",
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
