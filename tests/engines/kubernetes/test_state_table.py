"""Every native state of the Kubernetes executor, produced from a real-shaped cluster situation.

EXPECTED is this test's own copy of the mapping: each row is a state with what it must mean
in the ledger (None: deliberately unmapped) and the failure kind it carries. Each row is checked
by building its situation in the emulator and polling it through the real client, and the rows
must cover STATE_TABLE exactly, so a state added to one side only fails here.
"""

import pytest
from django.utils import timezone

from jobs.executors.kubernetes import KubernetesExecutor
from jobs.loops.reconciler import reconcile_all
from jobs.models import Cluster, Job, JobEvent
from jobs.states import JobStatus
from tests.engines.kubernetes.objects import (
    condition,
    job_condition,
    launch,
    not_scheduled,
    pod_for,
    running,
    terminated,
    waiting,
)
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.kubernetes
S = JobStatus
INGEST_TAIL = "sf.runner: ingest failed: snapshot download: HTTP 404: snapshot gone\n"

EXPECTED: dict[str, tuple[JobStatus | None, str]] = {
    "Pending": (S.PENDING, ""),
    "Pending/Suspended": (S.PENDING, ""),
    "Pending/Unschedulable": (S.PENDING, ""),
    "Pending/SchedulingGated": (S.PENDING, ""),
    "Pending/ContainerCreating": (S.PENDING, ""),
    "Pending/PodInitializing": (S.PENDING, ""),
    "Pending/ImagePullBackOff": (S.PENDING, ""),
    "Pending/ErrImagePull": (S.PENDING, ""),
    "Pending/InvalidImageName": (S.PENDING, ""),
    "Pending/CreateContainerConfigError": (S.PENDING, ""),
    "Pending/CreateContainerError": (S.PENDING, ""),
    "Running": (S.RUNNING, ""),
    "Succeeded": (S.SUCCEEDED, ""),
    "Failed": (S.FAILED, "exit"),
    "Failed/Killed": (S.FAILED, "exit"),
    "Failed/IngestFailed": (S.FAILED, "ingest"),
    "Failed/OOMKilled": (S.FAILED, "oom"),
    "Failed/Evicted": (S.FAILED, "lost"),
    "Failed/Preempted": (S.FAILED, "preempted"),
    "Failed/Disrupted": (S.FAILED, "lost"),
    "Failed/NodeLost": (S.FAILED, "lost"),
    "Failed/NotStarted": (S.FAILED, "lost"),
    "Failed/DeadlineExceeded": (S.FAILED, "deadline"),
    "JobFailed/BackoffLimitExceeded": (S.FAILED, "exit"),
    "JobFailed/PodFailurePolicy": (S.FAILED, "exit"),
    # Deliberately outside the table: recorded, the job keeps its status.
    "Unknown": (None, ""),
    "Pending/SomeFutureReason": (None, ""),
    "JobFailed/SomeFutureReason": (None, "exit"),
}


def _pod(status):
    return lambda api, job: api.add("pods", pod_for(job, status))


def _job(kind, reason, message=""):
    return lambda api, job: api.mutate(
        "jobs", job["metadata"]["name"], lambda j: job_condition(j, kind, reason, message)
    )


def _both(*steps):
    return lambda api, job: [step(api, job) for step in steps]


def _suspend(api, job):
    def change(j):
        j["spec"]["suspend"] = True
        j["status"]["conditions"] = [condition("Suspended", "True", "JobSuspended")]

    api.mutate("jobs", job["metadata"]["name"], change)


DISRUPTED = "Taint manager: deleting due to NoExecute taint"
SITUATIONS = {
    "Pending": lambda api, job: None,
    "Pending/Suspended": _suspend,
    "Pending/Unschedulable": _pod(
        not_scheduled(
            "Unschedulable",
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
            "available: 3 No preemption victims found for incoming pod.",
        )
    ),
    "Pending/SchedulingGated": _pod(
        not_scheduled("SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")
    ),
    "Pending/ContainerCreating": _pod(waiting("ContainerCreating")),
    "Pending/PodInitializing": _pod(waiting("PodInitializing")),
    "Pending/ImagePullBackOff": _pod(
        waiting("ImagePullBackOff", 'Back-off pulling image "registry.example/train:v2"')
    ),
    "Pending/ErrImagePull": _pod(
        waiting(
            "ErrImagePull",
            'failed to pull and unpack image "registry.example/train:v2": not found',
        )
    ),
    "Pending/InvalidImageName": _pod(
        waiting("InvalidImageName", 'couldn\'t parse image name "Train:V2": invalid reference')
    ),
    "Pending/CreateContainerConfigError": _pod(
        waiting("CreateContainerConfigError", 'secret "wandb-key" not found')
    ),
    "Pending/CreateContainerError": _pod(
        waiting("CreateContainerError", "context deadline exceeded")
    ),
    "Running": _pod(running()),
    "Succeeded": _both(_pod(terminated(0, "Completed")), _job("Complete", "CompletionsReached")),
    "Failed": _pod(terminated(2, "Error")),
    "Failed/Killed": _pod(terminated(128 + 15, "Error")),
    "Failed/IngestFailed": _pod(terminated(86, "Error", INGEST_TAIL)),
    "Failed/OOMKilled": _pod(terminated(137, "OOMKilled")),
    "Failed/Evicted": _pod(
        terminated(
            137,
            "Error",
            reason="Evicted",
            message="The node was low on resource: memory. Threshold quantity: 100Mi.",
            conditions=[condition("DisruptionTarget", "True", "TerminationByKubelet")],
        )
    ),
    "Failed/Preempted": _pod(
        terminated(
            143,
            "Error",
            conditions=[
                condition(
                    "DisruptionTarget",
                    "True",
                    "PreemptionByScheduler",
                    "default-scheduler: preempting to accommodate a higher priority pod",
                )
            ],
        )
    ),
    "Failed/Disrupted": _pod(
        terminated(
            137,
            "Error",
            conditions=[condition("DisruptionTarget", "True", "DeletionByTaintManager", DISRUPTED)],
        )
    ),
    "Failed/NodeLost": _pod(
        terminated(
            137,
            "ContainerStatusUnknown",
            "The container could not be located when the pod was terminated",
        )
    ),
    "Failed/NotStarted": _pod(
        {
            "phase": "Failed",
            "reason": "UnexpectedAdmissionError",
            "message": "Allocate failed due to requested number of devices unavailable for "
            "nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected",
        }
    ),
    "Failed/DeadlineExceeded": _both(
        _pod(terminated(143, "Error")),
        _job("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"),
    ),
    "JobFailed/BackoffLimitExceeded": _job(
        "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    ),
    "JobFailed/PodFailurePolicy": _job(
        "Failed",
        "PodFailurePolicy",
        "Container main for pod default/x failed with exit code 42 matching FailJob rule",
    ),
    "Unknown": _pod(
        {"phase": "Unknown", "reason": "NodeLost", "message": "Node gpu-node-1 is unresponsive"}
    ),
    "Pending/SomeFutureReason": _pod(waiting("SomeFutureReason", "a reason from Kubernetes 2.0")),
    "JobFailed/SomeFutureReason": _job("Failed", "SomeFutureReason"),
}


def test_the_expected_table_covers_the_state_table_exactly():
    mapped = {state for state, (status, _) in EXPECTED.items() if status is not None}
    assert mapped == set(KubernetesExecutor.STATE_TABLE)
    assert set(SITUATIONS) == set(EXPECTED)


@pytest.mark.parametrize("state", list(EXPECTED))
def test_each_native_state_comes_from_its_situation_and_maps_as_expected(
    executor, apiserver, state
):
    ref = executor.submit(launch())
    SITUATIONS[state](apiserver, apiserver.get("jobs", ref))
    obs = executor.poll([ref])[ref]
    status, failure = EXPECTED[state]
    assert obs.native_state == state
    assert executor.STATE_TABLE.get(state) == status
    assert obs.failure == failure
    if status == S.PENDING and state != "Pending":  # the reason shown under Diagnostics
        assert obs.message.startswith(state.split("/")[1])
    if state == "Failed/IngestFailed":
        assert obs.message == "ingest failed: snapshot download: HTTP 404: snapshot gone"
    if state == "Failed/Killed":
        assert obs.exit_code == -15


@pytest.fixture
def k8s_job(use_executor, db, team, alice, k8s_settings, monkeypatch):
    """A ledger job on a Kubernetes cluster, RUNNING as its launched attempt's Job."""
    cluster = Cluster.objects.create(name="gpu-k8s", kind="kubernetes", settings=k8s_settings)
    use_executor(KubernetesExecutor)
    job = queued_job(team, alice, cluster=cluster)
    ref = KubernetesExecutor(cluster).submit(launch(run_id=job.run_id, job_id=job.pk))
    with_attempt(job, S.RUNNING, job_ref=ref, pending_at=timezone.now())
    return job, ref


@pytest.mark.parametrize("state", ["Unknown", "Pending/SomeFutureReason"])
def test_an_unmapped_state_leaves_the_job_alone_and_is_recorded(apiserver, k8s_job, state):
    job, ref = k8s_job
    SITUATIONS[state](apiserver, apiserver.get("jobs", ref))
    reconcile_all()
    reconcile_all()
    assert Job.objects.get(pk=job.pk).status == S.RUNNING
    notes = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.OBSERVATION)
    assert [n.data["native_state"] for n in notes] == [state]
