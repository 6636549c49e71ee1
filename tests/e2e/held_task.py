"""A task for the redelivery test alone (loaded into its workers with `celery worker -I`).

Each run records which worker started it and when, in a Redis list the test reads, then holds
its worker for `hold_s` seconds, long enough for the test to kill that worker mid-task.
"""

import json
import os
import socket
import time

import redis
from celery import shared_task

RUNS_KEY = "sf-test-held-task-runs"


@shared_task(name="tests.e2e.held_task.hold", ignore_result=True)
def hold(hold_s: float) -> None:
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    worker = os.environ.get("SF_TEST_WORKER", socket.gethostname())
    client.rpush(RUNS_KEY, json.dumps({"worker": worker, "at": time.time()}))
    time.sleep(hold_s)
