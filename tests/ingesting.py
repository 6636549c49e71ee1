"""The runner's side of ingest, for the tests that play it: a job's attempt as the launcher
leaves it, the runner's job-token client, numbered log lines and metric points posted as the
runner posts them, and the log lines stored."""

import datetime as dt
import json

from django.test import Client
from django.utils import timezone

from jobs.job_tokens import job_token
from jobs.models import Attempt, Job
from jobs.stores import logstore

T0 = 1_700_000_000.0


def attach_attempt(job_id: int, number: int, status: str = "RUNNING") -> Attempt:
    """Test setup: the job's current attempt is `number`, in `status`, as the launcher leaves it."""
    attempt = Attempt.objects.create(
        job_id=job_id, number=number, total_gpus=1, backend_name=f"b-{job_id}-{number}"
    )
    Job.objects.filter(pk=job_id).update(
        current_attempt=attempt, attempt_count=number, status=status, status_changed_at=now()
    )
    return attempt


def finish(job_id: int, status: str = "SUCCEEDED", seconds_ago: float = 0) -> None:
    Job.objects.filter(pk=job_id).update(
        status=status, status_changed_at=now() - dt.timedelta(seconds=seconds_ago)
    )


def now() -> dt.datetime:
    return timezone.now()


def runner(job_id: int, attempt: int = 1) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {job_token(job_id, attempt)}")


def make_lines(start: int, stop: int, attempt: int = 1) -> list[dict]:
    return [
        {"seq": s, "stream": "stdout", "ts": T0 + s, "text": f"attempt {attempt} line {s}"}
        for s in range(start, stop)
    ]


def send_logs(client: Client, body):
    return client.post("/api/v1/ingest/logs", body, content_type="application/json")


def send_lines(client: Client, lines: list[dict], attempt: int = 1):
    return send_logs(client, {"attempt": attempt, "lines": lines})


def stored(job_id: int) -> list[str]:
    page = logstore.read(job_id, None, 10_000)
    return [json.loads(raw)["text"] for raw in page.raw_lines]


def make_points(start: int, stop: int, name: str = "loss", kind: str = "train") -> list[dict]:
    return [
        {"seq": s, "kind": kind, "name": name, "step": s, "value": 1.0 / (s + 1), "ts": T0 + s}
        for s in range(start, stop)
    ]


def send_metrics(client, body):
    raw = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post("/api/v1/ingest/metrics", raw, content_type="application/json")


def send_points(client, points: list[dict], attempt: int = 1):
    return send_metrics(client, {"attempt": attempt, "points": points})
