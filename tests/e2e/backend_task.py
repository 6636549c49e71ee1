"""A task for the worker-connections test alone (loaded into its worker with `celery worker -I`).

Each run records the PostgreSQL backend that served its query (its process id), in a Redis
list the test reads: the same backend from one task to the next means the worker kept its
session; a new one, that it opened another.
"""

import json
import os

import redis
from celery import shared_task
from django.db import connection

RUNS_KEY = "sf-test-backend-task-runs"


@shared_task(name="tests.e2e.backend_task.backend", ignore_result=True)
def backend() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    redis.Redis.from_url(os.environ["REDIS_URL"]).rpush(RUNS_KEY, json.dumps({"pid": pid}))
