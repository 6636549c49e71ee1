"""A pause or stop that races a scheduler tick closes the attempt the tick opened.

Found by the chaos suite: `_halt` read the job (and its attempt count) before taking the row
lock, so a job admitted in between was PAUSED with its new attempt left open.
"""

import datetime as dt

import pytest

from jobs.actions import control
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt
from jobs.states import JobStatus
from tests.factories import queued_job

pytestmark = pytest.mark.django_db
S = JobStatus


@pytest.mark.parametrize("halt", [control.pause_job, control.stop_job])
def test_a_halt_that_races_admission_closes_the_new_attempt(
    halt, make_team, make_user, noop_cluster, monkeypatch
):
    team = make_team("nlp", gpu_quota=4, cluster=noop_cluster)
    ann = make_user("ann", team, role="admin")
    job = queued_job(team, ann, total_gpus=1)
    checked = control._controllable

    def admitted_meanwhile(user, job_id):
        found = checked(user, job_id)  # the job as the request saw it: QUEUED, no attempt
        admit_queued_jobs(dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC))
        return found

    monkeypatch.setattr(control, "_controllable", admitted_meanwhile)
    halt(ann, job.pk)

    job.refresh_from_db()
    assert job.status in (S.PAUSED, S.STOPPED)
    assert job.attempt_count == 1
    assert not Attempt.objects.filter(job=job, end_time__isnull=True).exists()
