"""A real webhook receiver for tests: an HTTP server on 127.0.0.1 in a thread."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A real HTTP server on 127.0.0.1 that records each POST; the first `fail_first` get 500."""

    def __init__(self, fail_first: int = 0, status: int = 200) -> None:
        self.requests: list[dict] = []
        self.fail_first, self.status = fail_first, status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                failing = len(receiver.requests) <= receiver.fail_first
                self.send_response(500 if failing else receiver.status)
                self.end_headers()

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?src=sf"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
