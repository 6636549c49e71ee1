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


def race(steps: list, done, rounds: int) -> list:
    """Run each of `steps` in a looping thread at once until `done()` holds or `rounds` waits of
    50 ms have passed; the errors the threads raised (the first stops them all)."""
    errors: list = []
    stop = threading.Event()
    threads = [looping(step, errors, stop) for step in steps]
    for thread in threads:
        thread.start()
    for _ in range(rounds):
        stop.wait(0.05)
        if done():
            break
    stop.set()
    for thread in threads:
        thread.join()
    return errors
