"""Launch workers launching the same attempts at once on a real Ray: Ray refuses a second job
of a submission id anyway, so the check is that only one submit per attempt reaches it."""

import pytest

from jobs.executors.ray import RayExecutor
from jobs.models import Attempt, Cluster, Job
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt
from tests.launching import launch_at_once

pytestmark = [pytest.mark.ray, pytest.mark.django_db(transaction=True)]
WORKERS = 4
ATTEMPTS = 6


def test_workers_launching_the_same_attempts_at_once_submit_each_to_ray_once(
    make_team, make_user, ray_cluster, settings, monkeypatch
):
    settings.SF_API_URL = ""  # offline runners
    cluster = Cluster.objects.create(name="ray-ci", kind="ray", settings=ray_cluster.settings)
    team = make_team("physics", gpu_quota=8, cluster=cluster)
    user = make_user("bob", team)
    attempt_ids = []
    for _ in range(ATTEMPTS):
        job = queued_job(team, user, total_gpus=0, entrypoint=["python", "-c", "pass"])
        attempt_ids.append(with_attempt(job, JobStatus.SUBMITTED).pk)
    posts: list[str] = []
    request = RayExecutor._request

    def counting(self, method, path, body=None):
        if method == "POST" and path == "/api/jobs/":
            posts.append(body["submission_id"])
        return request(self, method, path, body)

    monkeypatch.setattr(RayExecutor, "_request", counting)
    launch_at_once(attempt_ids, WORKERS)
    names = Attempt.objects.filter(pk__in=attempt_ids).values_list("backend_name", flat=True)
    assert sorted(posts) == sorted(names)
    assert Job.objects.filter(status=JobStatus.PENDING).count() == ATTEMPTS
