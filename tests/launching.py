"""Several launchers at once on the same attempts, as workers on several hosts would be."""

import threading

from django.db import connection

from jobs.loops.launcher import LaunchOutcome, launch_attempts


def launch_at_once(attempt_ids: list[int], workers: int) -> list[LaunchOutcome]:
    """`workers` threads, each with a database connection of its own, call `launch_attempts`
    on the same ids at the same instant; the outcomes of them all."""
    start = threading.Barrier(workers)
    outcomes: list[LaunchOutcome] = []

    def worker() -> None:
        try:
            start.wait()
            outcomes.extend(launch_attempts(attempt_ids))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes
