"""Several launch workers on the same attempts at once, each with its own database session
(as Celery workers on different hosts have): every attempt reaches the engine once."""

import time

import pytest

from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job
from jobs.states import JobStatus
from tests.factories import queued_job
from tests.launching import launch_at_once

pytestmark = pytest.mark.django_db(transaction=True)
WORKERS = 4


def test_workers_launching_the_same_attempts_at_once_submit_each_once(
    backend, team, alice, monkeypatch
):
    for _ in range(40):
        queued_job(team, alice, total_gpus=0)
    attempt_ids = admit_queued_jobs().admitted
    submit = backend.submit

    def slow_submit(spec):  # long enough for every worker to be in launch_attempts at once
        time.sleep(0.05)
        return submit(spec)

    monkeypatch.setattr(backend, "submit", slow_submit)
    launched = [o.attempt_id for o in launch_at_once(attempt_ids, WORKERS) if o.job_ref]
    names = Attempt.objects.filter(pk__in=attempt_ids).values_list("backend_name", flat=True)
    assert sorted(backend.submitted) == sorted(names)  # each once, by whichever worker
    assert sorted(launched) == sorted(attempt_ids)
    assert Job.objects.filter(status=JobStatus.PENDING).count() == 40
