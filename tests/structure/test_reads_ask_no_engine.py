"""No engine call on a read path: reading jobs through the API or the console never asks an
executor anything (a Kubernetes capacity() is a node list and a cluster-wide pod list)."""

import pytest
from django.test import Client

from jobs.executors import Capacity
from jobs.loops import scheduler
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db


class Forbidden:
    """An executor that fails the test on any question: a read must not reach it."""

    def __init__(self, cluster=None) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        def call(*args, **kwargs):
            self.calls.append(name)
            raise AssertionError(f"a job read called the executor's {name}()")

        return call


@pytest.fixture
def jobs(team, alice, local_cluster):
    queued = queued_job(team, alice)
    running = queued_job(team, alice)
    with_attempt(running, "RUNNING", job_ref="ref-1")
    return [queued, running]


@pytest.fixture
def forbidden(use_executor) -> Forbidden:
    engine = Forbidden()
    use_executor(lambda cluster: engine)
    return engine


def test_reading_jobs_through_the_api_asks_no_engine(api, jobs, forbidden):
    paths = ["/jobs", "/jobs?limit=1", "/me"]
    for job in jobs:
        paths += [f"/jobs/{job.pk}{tail}" for tail in ("", "/events", "/attempts", "/diagnostics")]
        paths += [f"/jobs/{job.pk}/logs?tail=10", f"/jobs/{job.pk}/metrics"]
    for path in paths:
        response = api.get(path)
        assert response.status_code == 200, (path, response.content)
    assert forbidden.calls == []


def test_reading_jobs_in_the_console_asks_no_engine(alice, jobs, forbidden):
    browser = Client()
    browser.force_login(alice)
    for path in ["/", *(f"/jobs/{job.pk}/" for job in jobs), "/usage/", "/teams/"]:
        response = browser.get(path)
        assert response.status_code == 200, (path, response.status_code)
    assert forbidden.calls == []


def test_the_virtual_flag_a_read_shows_is_what_the_scheduler_last_saw(
    api, jobs, use_executor, local_cluster
):
    assert api.get(f"/jobs/{jobs[0].pk}").json()["virtual_gpus"] is True  # local: slots at first

    class RealDevices:
        def __init__(self, cluster) -> None:
            pass

        def capacity(self) -> Capacity:
            return Capacity(reachable=True, total_gpus=8, virtual=False)

    use_executor(RealDevices)
    scheduler.admit_queued_jobs()
    assert api.get(f"/jobs/{jobs[0].pk}").json()["virtual_gpus"] is False
