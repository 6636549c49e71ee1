"""A smoke test against a real cluster: create, adopt, poll to Running, cancel. KUBECONFIG only.

The image (SF_K8S_TEST_IMAGE, default python:3.11-slim) has no `sf` installed, so the container
command is overridden with a sleep: this checks what the emulator cannot (the real API server
accepts the manifest, a real kubelet reports the states parsed here, deletion cascades), not
the runner. SF_K8S_TEST_CONTEXT and SF_K8S_TEST_NAMESPACE pick where (default: the kubeconfig's
current context, namespace "default"). Nodes need no GPU: the Job asks for none.
"""

import os
import secrets
import time

import pytest

from jobs.executors.kubernetes import KubernetesExecutor
from jobs.executors.kubernetes.manifests import job_manifest
from jobs.models import Cluster
from jobs.states import JobStatus
from tests.engines.kubernetes.objects import launch

pytestmark = [
    pytest.mark.real_kubernetes,
    pytest.mark.skipif(
        not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set: no real cluster to use"
    ),
]


@pytest.fixture
def real_executor(monkeypatch) -> KubernetesExecutor:
    from kubernetes import config

    _, current = config.list_kube_config_contexts(os.environ["KUBECONFIG"])
    settings = {
        "kubeconfig": os.environ["KUBECONFIG"],
        "context": os.environ.get("SF_K8S_TEST_CONTEXT") or current["name"],
        "namespace": os.environ.get("SF_K8S_TEST_NAMESPACE", "default"),
        "image": os.environ.get("SF_K8S_TEST_IMAGE", "python:3.11-slim"),
    }
    executor = KubernetesExecutor(Cluster(name="real", kind="kubernetes", settings=settings))

    def sleeping(settings, name, spec, gpu_products=()):
        job = job_manifest(settings, name, spec, gpu_products)
        container = job["spec"]["template"]["spec"]["containers"][0]
        container["command"] = ["python", "-c", "import time; time.sleep(300)"]
        return job

    monkeypatch.setattr("jobs.executors.kubernetes.executor.job_manifest", sleeping)
    return executor


def test_a_tiny_job_is_created_adopted_seen_running_and_cancelled(real_executor):
    spec = launch(run_id=secrets.token_hex(8), total_gpus=0)
    ref = real_executor.submit(spec)
    try:
        assert real_executor.submit(spec) == ref  # adopted, not launched twice
        assert real_executor.capacity().reachable
        states: list[str] = []
        deadline = time.monotonic() + 240  # an image pull on a cold node takes a while
        while time.monotonic() < deadline:
            obs = real_executor.poll([ref]).get(ref)
            if obs and (not states or states[-1] != obs.native_state):
                states.append(obs.native_state)
            if obs and obs.native_state == "Running":
                break
            time.sleep(2)
        assert states and states[-1] == "Running", f"never ran; saw {states}"
        assert real_executor.STATE_TABLE[states[-1]] == JobStatus.RUNNING
        assert obs is not None and obs.start_time is not None
    finally:
        real_executor.cancel(ref)
    real_executor.cancel(ref)  # idempotent
    deadline = time.monotonic() + 120
    while real_executor.find(ref) is not None:  # Foreground: gone once its pod is
        assert time.monotonic() < deadline, "the Job was not deleted"
        time.sleep(2)
