"""A backend handle handed out twice: each attempt takes only the observation of its own object.

Found by the chaos suite: a SIGKILLed slurmctld that restarts from an older state gives new jobs
the ids of jobs it forgot. The reconciler polled by id alone, so the forgotten attempt took the
new attempt's outcome, and a closed attempt's orphan sweep cancelled the new attempt's job.
"""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.executors import Observation
from jobs.loops.reconciler import reconcile_all
from jobs.models import Attempt, Job
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus


def pending_with_ref(team, user, ref: str) -> Attempt:
    job = queued_job(team, user)
    return with_attempt(
        job,
        S.PENDING,
        job_ref=ref,
        submitted_at=timezone.now() - dt.timedelta(minutes=5),
        pending_at=timezone.now(),
    )


def test_an_attempt_ignores_the_end_of_another_attempts_object_under_its_ref(backend, team, alice):
    forgotten = pending_with_ref(team, alice, "77")
    current = pending_with_ref(team, alice, "77")
    now = timezone.now()
    backend.states["77"] = Observation(
        "OK", exit_code=0, start_time=now, end_time=now, name=current.backend_name
    )
    reconcile_all()
    assert Job.objects.get(pk=current.job_id).status == S.SUCCEEDED
    assert Job.objects.get(pk=forgotten.job_id).status == S.PENDING


def test_the_orphan_sweep_does_not_cancel_a_new_attempt_under_a_reused_ref(backend, team, alice):
    closed = pending_with_ref(team, alice, "77")
    Attempt.objects.filter(pk=closed.pk).update(end_time=timezone.now())
    Job.objects.filter(pk=closed.job_id).update(status=S.PAUSED)
    current = pending_with_ref(team, alice, "77")
    backend.states["77"] = Observation("RUN", start_time=timezone.now(), name=current.backend_name)
    reconcile_all()
    assert backend.cancelled == []
    assert Job.objects.get(pk=current.job_id).status == S.RUNNING
