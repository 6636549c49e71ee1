"""A worker thread for the concurrency tests: repeats a step until told to stop."""

import threading

from django.db import connections


def looping(step, errors: list, stop: threading.Event) -> threading.Thread:
    """A thread that runs `step` until `stop` is set; its first error is kept and stops all."""

    def run():
        try:
            while not stop.is_set():
                step()
        except Exception as exc:  # surfaced by the test, not swallowed
            errors.append(exc)
            stop.set()
        finally:
            connections.close_all()

    return threading.Thread(target=run)
