"""The executor against pods the FakeKubelet really runs: `python -m sf.runner`, offline."""

import json
import sys
import time

import pytest
from django.utils import timezone

from jobs.executors import Observation
from jobs.executors.kubernetes import KubernetesExecutor
from jobs.loops.reconciler import reconcile_all
from jobs.models import Attempt, Cluster, Job
from jobs.states import JobStatus
from tests.engines.kubernetes.objects import launch
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.kubernetes
S = JobStatus


def script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def wait_for(executor, ref, states, timeout=20.0) -> tuple[Observation, list[str]]:
    """Poll like the reconciler until the attempt reaches one of `states`; all states seen."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        obs = executor.poll([ref]).get(ref)
        if obs and (not seen or seen[-1] != obs.native_state):
            seen.append(obs.native_state)
        if obs and obs.native_state in states:
            return obs, seen
        time.sleep(0.05)
    raise AssertionError(f"{ref} never reached {states}; saw {seen}")


def test_an_offline_runner_runs_and_the_executor_sees_running_then_succeeded(executor, kubelet):
    ref = executor.submit(launch(entrypoint=script("import time; time.sleep(1.2); print('hi')")))
    running, _ = wait_for(executor, ref, {"Running"})
    done, seen = wait_for(executor, ref, {"Succeeded", "Failed"})
    assert seen[-1] == "Succeeded" and done.exit_code == 0
    assert running.start_time is not None and done.start_time == running.start_time
    assert done.end_time is not None and done.end_time > done.start_time
    exit_file = json.loads((kubelet.workdir(ref) / "exit.json").read_text())
    assert exit_file["exit_code"] == 0  # the runner itself wrote it: it really ran
    assert "hi" in (kubelet.workdir(ref) / "console.log").read_text()


def test_a_failing_entrypoint_reports_its_exit_code(executor, kubelet):
    ref = executor.submit(launch(entrypoint=script("raise SystemExit(3)")))
    done, _ = wait_for(executor, ref, {"Succeeded", "Failed"})
    assert (done.native_state, done.exit_code, done.failure) == ("Failed", 3, "exit")


def test_an_entrypoint_killed_by_a_signal_is_reported_as_minus_n(executor, kubelet):
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    ref = executor.submit(launch(entrypoint=script(kill)))
    done, _ = wait_for(executor, ref, {"Failed/Killed", "Failed"})
    assert (done.native_state, done.exit_code) == ("Failed/Killed", -15)


def test_a_snapshot_without_an_api_fails_ingest(executor, kubelet):
    spec = launch()
    ref = executor.submit(
        launch(env={**spec.env, "SF_SNAPSHOT": "abc123", "SF_ENTRYPOINT": '["true"]'})
    )
    done, _ = wait_for(executor, ref, {"Failed/IngestFailed", "Failed"})
    assert (done.native_state, done.failure, done.exit_code) == (
        "Failed/IngestFailed",
        "ingest",
        None,
    )
    assert done.message == "ingest failed: SF_SNAPSHOT is set but SF_API_URL is empty"


def test_a_held_pod_is_pending_with_its_reason_until_released(executor, kubelet):
    ref = executor.submit(launch(entrypoint=script("pass")))
    kubelet.hold(ref)
    held, _ = wait_for(executor, ref, {"Pending/ImagePullBackOff"})
    assert held.message.startswith("ImagePullBackOff: Back-off pulling image")
    kubelet.release(ref)
    wait_for(executor, ref, {"Succeeded"})


def test_an_unschedulable_pod_says_why(executor, kubelet):
    ref = executor.submit(launch())
    kubelet.unschedulable(ref)
    obs, _ = wait_for(executor, ref, {"Pending/Unschedulable"})
    assert "Insufficient nvidia.com/gpu" in obs.message
    assert kubelet.pod(ref)["spec"].get("nodeName") is None


@pytest.mark.parametrize(
    ("control", "state", "failure", "exit_code"),
    [("oom_kill", "Failed/OOMKilled", "oom", -9), ("evict", "Failed/Evicted", "lost", None)],
)
def test_oom_kill_and_eviction_end_the_process(
    executor, kubelet, control, state, failure, exit_code
):
    ref = executor.submit(launch(entrypoint=script("import time; time.sleep(60)")))
    wait_for(executor, ref, {"Running"})
    getattr(kubelet, control)(ref)
    done, _ = wait_for(executor, ref, {state})
    assert (done.failure, done.exit_code) == (failure, exit_code)


def test_a_job_past_its_active_deadline_fails_as_deadline(k8s_settings, kubelet):
    settings = {**k8s_settings, "active_deadline_s": 1}
    executor = KubernetesExecutor(Cluster(name="short", kind="kubernetes", settings=settings))
    ref = executor.submit(launch(entrypoint=script("import time; time.sleep(60)")))
    done, _ = wait_for(executor, ref, {"Failed/DeadlineExceeded"}, timeout=30)
    assert done.failure == "deadline"
    assert done.message == "DeadlineExceeded: Job was active longer than specified deadline"


def test_a_silent_node_leaves_the_pod_unknown(executor, kubelet):
    ref = executor.submit(launch(entrypoint=script("import time; time.sleep(60)")))
    wait_for(executor, ref, {"Running"})
    kubelet.unknown(ref)
    obs, _ = wait_for(executor, ref, {"Unknown"})
    assert obs.native_state not in executor.STATE_TABLE


def wait_for_file(path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_cancel_kills_the_running_process(executor, kubelet, apiserver):
    ref = executor.submit(launch(entrypoint=script("import time; time.sleep(60)")))
    wait_for(executor, ref, {"Running"})
    wait_for_file(kubelet.workdir(ref) / "started.json")  # the entrypoint itself is up
    executor.cancel(ref)
    assert executor.poll([ref]) == {} and apiserver.select("pods") == []
    wait_for_file(kubelet.workdir(ref) / "exit.json")  # the runner stopped it and said so
    exit_file = json.loads((kubelet.workdir(ref) / "exit.json").read_text())
    assert exit_file["reason"] == "killed by signal 15"


def test_the_reconciler_walks_a_kubernetes_job_to_succeeded(
    use_executor, db, team, alice, k8s_settings, kubelet, monkeypatch
):
    cluster = Cluster.objects.create(name="gpu-k8s", kind="kubernetes", settings=k8s_settings)
    use_executor(KubernetesExecutor)
    job = queued_job(team, alice, cluster=cluster)
    executor = KubernetesExecutor(cluster)
    spec = launch(run_id=job.run_id, job_id=job.pk, entrypoint=script("import time; time.sleep(1)"))
    ref = executor.submit(spec)
    attempt = with_attempt(job, S.PENDING, job_ref=ref, pending_at=timezone.now())
    statuses: list[str] = []
    deadline = time.monotonic() + 20
    while Job.objects.get(pk=job.pk).status not in S.terminal():
        assert time.monotonic() < deadline, f"stuck; saw {statuses}"
        reconcile_all()
        status = Job.objects.get(pk=job.pk).status
        if not statuses or statuses[-1] != status:
            statuses.append(status)
        time.sleep(0.05)
    attempt = Attempt.objects.get(pk=attempt.pk)
    assert statuses[-1] == S.SUCCEEDED and S.RUNNING in statuses
    assert attempt.exit_code == 0 and attempt.start_time and attempt.end_time
    assert attempt.start_time < attempt.end_time
