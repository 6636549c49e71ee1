"""Never bill more than the engine on Kubernetes (issue 50): an attempt's engine times are its
pods' container run (`startedAt`, `finishedAt`, whole seconds), kept on the attempt, and the
bill stays within them. Against the API emulator, and the fake kubelet running real runners."""

import datetime as dt
import sys
import time

import pytest
from django.utils import timezone

from jobs.executors.kubernetes import KubernetesExecutor
from jobs.loops.reconciler import reconcile_all
from jobs.models import Cluster, Job
from jobs.states import JobStatus
from tests.engines.kubernetes.objects import (
    condition,
    job_condition,
    launch,
    pod_for,
    running,
    terminated,
)
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.kubernetes
S = JobStatus
SECOND = dt.timedelta(seconds=1)


def rfc3339(at: dt.datetime) -> str:
    """A time as Kubernetes writes it: whole seconds, cut short."""
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def parsed(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


def t(seconds: int) -> str:
    return f"2025-03-01T10:00:{seconds:02d}Z"


# -- what a poll reports -----------------------------------------------------------------------


def test_a_running_pod_reports_its_containers_start_as_the_engines(executor, apiserver):
    ref = executor.submit(launch())
    apiserver.add("pods", pod_for(apiserver.get("jobs", ref), running(started=t(7))))
    obs = executor.poll([ref])[ref]
    assert (obs.engine_start, obs.engine_end) == (parsed(t(7)), None)
    assert obs.start_time == obs.engine_start and obs.engine_start_bills


@pytest.mark.parametrize(
    "status",
    [
        terminated(0, "Completed", started=t(3), finished=t(41)),
        terminated(2, "Error", started=t(3), finished=t(41)),
        terminated(
            137,
            "Error",
            started=t(3),
            finished=t(41),
            reason="Evicted",
            message="The node was low on resource: memory.",
            conditions=[condition("DisruptionTarget", "True", "TerminationByKubelet")],
        ),
    ],
    ids=["succeeded", "failed", "evicted"],
)
def test_an_ended_pod_reports_its_containers_run_as_the_engines(executor, apiserver, status):
    ref = executor.submit(launch())
    apiserver.add("pods", pod_for(apiserver.get("jobs", ref), status))
    obs = executor.poll([ref])[ref]
    assert (obs.engine_start, obs.engine_end) == (parsed(t(3)), parsed(t(41)))
    assert (obs.start_time, obs.end_time) == (obs.engine_start, obs.engine_end)
    assert obs.engine_start_bills  # one pod: its container's start is the attempt's


def test_a_pod_that_never_ran_reports_no_engine_times(executor, apiserver):
    ref = executor.submit(launch())
    never = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "no GPU"}
    apiserver.add("pods", pod_for(apiserver.get("jobs", ref), never))
    obs = executor.poll([ref])[ref]
    assert (obs.native_state, obs.engine_start, obs.engine_end) == ("Failed/NotStarted", None, None)


def test_a_deadline_reports_the_containers_run(executor, apiserver):
    ref = executor.submit(launch())
    job = apiserver.get("jobs", ref)
    apiserver.add("pods", pod_for(job, terminated(143, "Error", started=t(5), finished=t(30))))
    apiserver.mutate("jobs", ref, lambda j: job_condition(j, "Failed", "DeadlineExceeded", ""))
    obs = executor.poll([ref])[ref]
    assert obs.native_state == "Failed/DeadlineExceeded"
    assert (obs.engine_start, obs.engine_end) == (parsed(t(5)), parsed(t(30)))


def test_a_gangs_engine_times_span_its_pods_and_its_bill_starts_with_the_last_rank(
    executor, apiserver
):
    """Rank 1 came up 4 s after rank 0 and finished 2 s after it: the engine's record is
    rank 0's start to rank 1's finish; the attempt ran (and is billed) from rank 1's start."""
    ref = executor.submit(launch(nodes=2, total_gpus=2))
    job = apiserver.get("jobs", ref)
    ranks = [(t(2), t(40)), (t(6), t(42))]
    for index, (started, finished) in enumerate(ranks):
        status = terminated(0, "Completed", started=started, finished=finished)
        apiserver.add("pods", pod_for(job, status, suffix=f"rank{index}", index=index))
    obs = executor.poll([ref])[ref]
    assert obs.native_state == "Succeeded"
    assert (obs.engine_start, obs.engine_end) == (parsed(t(2)), parsed(t(42)))
    assert obs.start_time == parsed(t(6)) and not obs.engine_start_bills


def test_a_gangs_engine_end_waits_until_none_of_its_pods_runs(executor, apiserver):
    """Rank 1 failed; rank 0 still runs (the Job controller is ending it): the attempt has
    ended, but the engine's end is known only once rank 0's container has finished."""
    ref = executor.submit(launch(nodes=2, total_gpus=2))
    job = apiserver.get("jobs", ref)
    apiserver.add("pods", pod_for(job, running(started=t(2)), suffix="rank0", index=0))
    failed = terminated(3, "Error", started=t(3), finished=t(20))
    apiserver.add("pods", pod_for(job, failed, suffix="rank1", index=1))
    obs = executor.poll([ref])[ref]
    assert (obs.native_state, obs.details["failed_rank"]) == ("Failed", 1)
    assert (obs.engine_start, obs.engine_end, obs.end_time) == (parsed(t(2)), None, parsed(t(20)))
    killed = terminated(143, "Error", started=t(2), finished=t(21))
    assert apiserver.mutate("pods", f"{ref}-0-rank0", lambda pod: pod.update(status=killed))
    obs = executor.poll([ref])[ref]
    assert (obs.engine_start, obs.engine_end) == (parsed(t(2)), parsed(t(21)))


# -- what the ledger keeps ---------------------------------------------------------------------


@pytest.fixture
def k8s_cluster(use_executor, db, k8s_settings) -> Cluster:
    use_executor(KubernetesExecutor)
    return Cluster.objects.create(name="gpu-k8s", kind="kubernetes", settings=k8s_settings)


def test_an_ended_pod_is_billed_its_containers_run_not_the_runners_report(
    k8s_cluster, team, alice, apiserver
):
    """The runner reported its start 1.4 s after its container's; the last log line came
    after the container's end, which Kubernetes cut to its second: the bill is the engine's."""
    job = queued_job(team, alice, cluster=k8s_cluster)
    ref = KubernetesExecutor(k8s_cluster).submit(launch(run_id=job.run_id, job_id=job.pk))
    now = timezone.now().replace(microsecond=0)
    started, finished = now - 40 * SECOND, now - 5 * SECOND
    attempt = with_attempt(
        job,
        S.RUNNING,
        job_ref=ref,
        submitted_at=now - 60 * SECOND,
        start_time=started + 1.4 * SECOND,
        alive_at=finished + 0.6 * SECOND,
    )
    status = terminated(0, "Completed", started=rfc3339(started), finished=rfc3339(finished))
    apiserver.add("pods", pod_for(apiserver.get("jobs", ref), status))
    reconcile_all()
    attempt.refresh_from_db()
    assert Job.objects.get(pk=job.pk).status == S.SUCCEEDED
    assert (attempt.engine_start, attempt.engine_end) == (started, finished)
    assert (attempt.start_time, attempt.end_time) == (started, finished)


def test_a_real_gang_is_billed_within_its_pods_run(k8s_cluster, team, alice, gpu_nodes):
    """Two ranks of real runners on the fake kubelet, rank 1 held back a second: the attempt
    keeps its pods' span as the engine's times and is billed from its last rank's start to no
    later than the last container's end."""
    job = queued_job(team, alice, total_gpus=8, nodes=2, cluster=k8s_cluster)
    code = "import time; time.sleep(1.5)"
    spec = launch(
        run_id=job.run_id,
        job_id=job.pk,
        nodes=2,
        total_gpus=8,
        entrypoint=[sys.executable, "-c", code],
    )
    ref = KubernetesExecutor(k8s_cluster).submit(spec)
    gpu_nodes.hold(ref, index=1)
    attempt = with_attempt(job, S.PENDING, nodes=2, job_ref=ref, pending_at=timezone.now())
    deadline = time.monotonic() + 20
    while not (gpu_nodes.pods(ref).get(0) or {}).get("status", {}).get("containerStatuses"):
        assert time.monotonic() < deadline, "rank 0 never started"
        time.sleep(0.05)
    time.sleep(1.1)  # container starts are timed to the second: rank 1 starts after rank 0
    gpu_nodes.release(ref, index=1)
    while Job.objects.get(pk=job.pk).status not in S.terminal():
        assert time.monotonic() < deadline + 20, Job.objects.get(pk=job.pk).status
        reconcile_all()
        time.sleep(0.05)
    attempt.refresh_from_db()
    assert Job.objects.get(pk=job.pk).status == S.SUCCEEDED
    runs = [
        pod["status"]["containerStatuses"][0]["state"]["terminated"]
        for pod in gpu_nodes.pods(ref).values()
    ]
    starts = [parsed(run["startedAt"]) for run in runs]
    ends = [parsed(run["finishedAt"]) for run in runs]
    assert (attempt.engine_start, attempt.engine_end) == (min(starts), max(ends))
    assert attempt.start_time == max(starts) > attempt.engine_start  # from the last rank up
    assert attempt.end_time <= attempt.engine_end
    billed = attempt.end_time - attempt.start_time
    assert billed <= attempt.engine_end - attempt.engine_start
