"""The whole product on Kubernetes, as far as this machine allows: the API emulator plus a node.

No kube-apiserver can run here, so the stack's worker talks with the real `kubernetes` client to
the in-repo API emulator (`apiserver.py`), and `FakeKubelet` plays the Job controller and one
node: it runs each pod's container command (the real `python -m sf.runner`, which fetches the
snapshot from the live stack and ships logs) as a local process and reports pod phases and
container states as a real kubelet does. The out-of-memory kill is the kubelet's report
(terminated, reason OOMKilled, exit 137), which is what a real cluster shows.
"""

import sys
from collections.abc import Iterator

import pytest

from tests.engines.kubernetes.apiserver import FakeApiServer
from tests.engines.kubernetes.kubelet import FakeKubelet
from tests.engines.kubernetes.objects import node
from tests.engines.proof import EngineProof, engine_proof

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[FakeApiServer, FakeKubelet]]:
    root = tmp_path_factory.mktemp("k8s")
    with FakeApiServer() as api, FakeKubelet(api, node="node-1", root=root / "node") as kubelet:
        api.add("nodes", node("node-1", 4))  # the node the kubelet plays: 4 allocatable GPUs
        yield api, kubelet


@pytest.fixture(scope="module")
def proof(cluster, tmp_path_factory) -> Iterator[EngineProof]:
    api, _ = cluster

    def alive(job_ref: str) -> bool:
        """True while the Job exists and has not finished (a Complete or Failed condition)."""
        job = api.get("jobs", job_ref)
        if job is None:
            return False
        conditions = (job.get("status") or {}).get("conditions") or []
        return not any(
            c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions
        )

    settings = {
        "kubeconfig": str(api.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")),
        "context": "emulator",
        "namespace": "default",
        "image": "registry.example/train:v2",
        "python": sys.executable,  # the fake node runs the container's command on this host
    }
    # A 3 s minimum runtime before preemption, for the preemption proof; a 30 s grace.
    settings["preempt_grace_s"] = 30
    with engine_proof(
        tmp_path_factory, "kubernetes", settings, alive, SF_PREEMPT_MIN_RUNTIME_S="3"
    ) as running_proof:
        yield running_proof


def test_the_example_training_job_runs_on_two_gpus_to_succeeded(proof, cluster):
    api, _ = cluster
    job = proof.succeeds_with_gpus(2, expect_devices=None)
    spec = api.get("jobs", job["job_ref"])["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (2, "2")
    assert container["command"][1:] == ["-m", "sf.runner"]


def test_pause_deletes_the_job_and_resume_continues_from_the_checkpoint(proof):
    proof.pauses_and_resumes()


def test_a_non_zero_exit_fails_the_job_with_its_code(proof):
    proof.fails_with_exit_code(1)


def test_an_oom_killed_container_fails_the_job_as_out_of_memory(proof, cluster):
    _, kubelet = cluster
    failed = proof.fails_out_of_memory(kubelet.oom_kill)
    assert failed["status_reason"].startswith("out of memory (killed by signal 9)")


def test_stop_deletes_the_job_and_its_pod(proof, cluster):
    api, _ = cluster
    proof.stops()
    assert not api.select("pods", "default", "app.kubernetes.io/managed-by=starforge") or all(
        (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        for p in api.select("pods", "default", "app.kubernetes.io/managed-by=starforge")
    )


def test_a_borrower_is_preempted_through_its_pods_deletion_checkpoints_and_resumes(proof):
    """The Job's deletion is the notice: the pod's SIGTERM reaches the runner, which gives the
    job the 30 s grace (SF_STOP_GRACE_S; the pod's terminationGracePeriodSeconds is 45 s)."""
    proof.preempts_a_borrower(grace_s=30, tick_s=2.0)
