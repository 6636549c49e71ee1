"""Jobs on several nodes on Kubernetes (issue 14): an Indexed Job with a headless Service, the
rank contract in every pod, RUNNING only with every rank up, one rank's failure ending all,
GPU types by node label, images the cluster allows, capacity per node, one bootstrap exchange
per rank. Against the API emulator, the fake scheduler and kubelet running real runners."""

import datetime as dt
import json
import sys
import time

import pytest
from django.test import Client
from django.utils import timezone

from jobs.executors import LaunchError, NodeCapacity
from jobs.executors.base import check_request
from jobs.executors.kubernetes import KubernetesExecutor
from jobs.executors.kubernetes.manifests import job_manifest
from jobs.job_tokens import bootstrap_token_for
from jobs.loops.reconciler import reconcile_all
from jobs.models import Attempt, Cluster, Job
from jobs.states import JobStatus
from tests.api_helpers import assert_refused
from tests.engines.kubernetes.apiserver import ApiError
from tests.engines.kubernetes.objects import (
    A100,
    A100_PCIE,
    COMPLETION_INDEX,
    GPU_PRODUCT,
    H100,
    foreign_pod,
    launch,
    node,
    pod_for,
    running,
    terminated,
)
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.kubernetes
S = JobStatus
INDEX_REF = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
ALLOWED = "registry.example.com/team/*:*"


def script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def wait_for(executor, ref, states, timeout=20.0):
    """Poll until the attempt reaches one of `states`; its observation then."""
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        obs = executor.poll([ref]).get(ref)
        if obs and (not seen or seen[-1] != obs.native_state):
            seen.append(obs.native_state)
        if obs and obs.native_state in states:
            return obs
        time.sleep(0.05)
    raise AssertionError(f"{ref} never reached {states}; saw {seen}")


def until(check, timeout=20.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} never held"
        time.sleep(0.05)


def states(obs) -> list[tuple[str, str, int | None]]:
    return [(r["node"], r["state"], r["exit_code"]) for r in obs.details["ranks"]]


def executor_with(k8s_settings, **settings) -> KubernetesExecutor:
    cluster = Cluster(name="gpu-k8s", kind="kubernetes", settings={**k8s_settings, **settings})
    return KubernetesExecutor(cluster)


# -- the Indexed Job and its Service -----------------------------------------------------------


def test_a_job_on_two_nodes_is_an_indexed_job_with_a_headless_service(executor, apiserver):
    ref = executor.submit(launch(nodes=2, total_gpus=8))
    job = apiserver.get("jobs", ref)
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert spec["backoffLimit"] == 0
    assert spec["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [0]},
            }
        ]
    }
    pod = spec["template"]["spec"]
    assert (pod["restartPolicy"], pod["subdomain"]) == ("Never", ref)
    (container,) = pod["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "4"}}  # per pod: 8 / 2
    service = apiserver.get("services", ref)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/managed-by": "starforge",
        "starforge.io/run-id": "0123456789abcdef",
        "starforge.io/attempt": "1",
    }
    (owner,) = service["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", ref, job["metadata"]["uid"])


def test_a_second_submit_adopts_the_job_and_its_service(executor, apiserver):
    assert executor.submit(launch(nodes=2, total_gpus=2)) == executor.submit(
        launch(nodes=2, total_gpus=2)
    )
    assert (len(apiserver.select("jobs")), len(apiserver.select("services"))) == (1, 1)
    assert apiserver.count("POST", "/api/v1/namespaces/default/services") == 2


def test_a_service_that_failed_is_made_by_the_next_submit(executor, apiserver):
    services = "/api/v1/namespaces/default/services"
    apiserver.fail("POST", services, 500, "InternalError", "etcdserver: request timed out")
    with pytest.raises(LaunchError) as failed:
        executor.submit(launch(nodes=2, total_gpus=2))
    assert not failed.value.permanent and "creating Service" in str(failed.value)
    ref = executor.submit(launch(nodes=2, total_gpus=2))  # the Job is adopted, its Service made
    owner = apiserver.get("services", ref)["metadata"]["ownerReferences"][0]
    assert owner["uid"] == apiserver.get("jobs", ref)["metadata"]["uid"]


def test_cancel_takes_the_pods_and_the_service_with_the_job(executor, apiserver):
    ref = executor.submit(launch(nodes=2, total_gpus=2))
    job = apiserver.get("jobs", ref)
    for index in (0, 1):
        apiserver.add("pods", pod_for(job, running(), suffix=f"r{index}xyz", index=index))
    executor.cancel(ref)
    assert apiserver.select("jobs") == apiserver.select("pods") == apiserver.select("services")


def test_a_single_node_job_gets_no_index_no_service_and_what_it_asks_per_node(executor, apiserver):
    ref = executor.submit(launch(total_gpus=2, cpus=16, memory_mb=65536))
    spec = apiserver.get("jobs", ref)["spec"]
    assert (spec["completionMode"], spec["completions"]) == ("NonIndexed", 1)  # the defaults
    assert "podFailurePolicy" not in spec
    assert apiserver.select("services") == []
    (container,) = spec["template"]["spec"]["containers"]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "2", "cpu": "16", "memory": "65536Mi"},
        "requests": {"cpu": "16", "memory": "65536Mi"},
    }
    assert "subdomain" not in spec["template"]["spec"]


# -- the rank contract in every pod ------------------------------------------------------------

PRINT_CONTRACT = script(
    "import json, os; names = ['SF_NODE_RANK', 'NODE_RANK', 'PET_NODE_RANK', "
    "'JOB_COMPLETION_INDEX', 'SF_NUM_NODES', 'SF_GPUS_PER_NODE', 'SF_MASTER_ADDR', "
    "'SF_MASTER_PORT', 'SF_NODE_ADDRS', 'MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', "
    "'PET_NNODES', 'PET_NPROC_PER_NODE', 'HOSTNAME', 'SF_RANK_LAUNCH']; "
    "print(json.dumps({n: os.environ.get(n) for n in names}))"
)


def test_every_pod_runs_its_rank_of_the_contract_on_its_own_node(executor, gpu_nodes):
    ref = executor.submit(launch(nodes=2, total_gpus=8, entrypoint=PRINT_CONTRACT))
    done = wait_for(executor, ref, {"Succeeded", "Failed", "JobFailed/BackoffLimitExceeded"})
    assert (done.native_state, done.exit_code) == ("Succeeded", 0)
    assert states(done) == [("a100-1", "succeeded", 0), ("a100-2", "succeeded", 0)]
    addrs = f"{ref}-0.{ref},{ref}-1.{ref}"
    for rank in (0, 1):
        console = (gpu_nodes.workdir(ref, index=rank) / "console.log").read_text()
        seen = json.loads(console.strip().splitlines()[-1])
        assert seen == {
            "SF_NODE_RANK": str(rank),
            "NODE_RANK": str(rank),
            "PET_NODE_RANK": str(rank),
            "JOB_COMPLETION_INDEX": str(rank),
            "SF_NUM_NODES": "2",
            "SF_GPUS_PER_NODE": "4",
            "SF_MASTER_ADDR": f"{ref}-0.{ref}",
            "SF_MASTER_PORT": "29500",
            "SF_NODE_ADDRS": addrs,
            "MASTER_ADDR": f"{ref}-0.{ref}",
            "MASTER_PORT": "29500",
            "WORLD_SIZE": "2",
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "4",
            "HOSTNAME": f"{ref}-{rank}",  # the indexed pod's host name, under the Service
            "SF_RANK_LAUNCH": None,  # each pod's runner runs its one rank itself
        }


def test_the_rank_contract_overrides_a_jobs_own_variable_of_the_same_name(apiserver, k8s_settings):
    executor = executor_with(k8s_settings, master_port=23456)
    spec = launch(nodes=3, total_gpus=3)
    spec = type(spec)(
        **{**spec.__dict__, "env": {**spec.env, "NODE_RANK": "7", "MASTER_PORT": "1"}}
    )
    (container,) = apiserver.get("jobs", executor.submit(spec))["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e for e in container["env"]}
    assert [e["name"] for e in container["env"]] == sorted(env)  # one entry per name
    assert env["NODE_RANK"] == {"name": "NODE_RANK", "valueFrom": INDEX_REF}
    assert env["MASTER_PORT"] == {"name": "MASTER_PORT", "value": "23456"}
    assert env["SF_GPUS_PER_NODE"]["value"] == "1"


# -- RUNNING only with every rank up -----------------------------------------------------------


def test_the_attempt_runs_only_once_every_rank_runs_from_the_last_ranks_start(executor, gpu_nodes):
    ref = executor.submit(
        launch(nodes=2, total_gpus=8, entrypoint=script("import time; time.sleep(60)"))
    )
    gpu_nodes.hold(ref, index=1)
    waiting = wait_for(executor, ref, {"Pending/ImagePullBackOff"})  # rank 0's is shown first
    assert executor.STATE_TABLE[waiting.native_state] == S.PENDING
    assert waiting.message.startswith(
        "not all nodes started: 1 of 2 running; rank 1: ImagePullBackOff: Back-off pulling image"
    )
    assert states(waiting) == [("a100-1", "running", None), ("a100-2", "pending", None)]
    time.sleep(1.1)  # container starts are timed to the second: rank 1 starts after rank 0
    gpu_nodes.release(ref, index=1)
    up = wait_for(executor, ref, {"Running"})
    starts = {
        i: pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        for i, pod in gpu_nodes.pods(ref).items()
    }
    assert starts[1] > starts[0]
    assert up.start_time == dt.datetime.fromisoformat(starts[1])  # metered from the last rank
    executor.cancel(ref)


def test_a_partial_start_stays_pending_until_the_pending_deadline_ends_it(
    use_executor, db, team, alice, k8s_settings, gpu_nodes
):
    """Three ranks of 4 A100s on a cluster with two such nodes: two run, one never fits."""
    cluster = Cluster.objects.create(name="gpu-k8s", kind="kubernetes", settings=k8s_settings)
    use_executor(KubernetesExecutor)
    job = queued_job(team, alice, total_gpus=12, nodes=3, gpu_type="a100", cluster=cluster)
    spec = launch(
        run_id=job.run_id,
        job_id=job.pk,
        nodes=3,
        total_gpus=12,
        gpu_type="a100",
        entrypoint=script("import time; time.sleep(60)"),
    )
    ref = KubernetesExecutor(cluster).submit(spec)
    attempt = with_attempt(job, S.PENDING, nodes=3, job_ref=ref, pending_at=timezone.now())
    until(
        lambda: (
            [r["state"] for r in KubernetesExecutor(cluster).poll([ref])[ref].details["ranks"]]
            == ["running", "running", "pending"]
        ),
        what="two ranks running",
    )
    reconcile_all()
    attempt.refresh_from_db()
    assert Job.objects.get(pk=job.pk).status == S.PENDING and attempt.start_time is None
    assert attempt.native_state == "Pending/Unschedulable"
    assert attempt.native_message.startswith(
        "not all nodes started: 2 of 3 running; rank 2: Unschedulable: 0/3 nodes are available: "
        "2 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector."
    )
    assert [(r["node"], r["state"]) for r in attempt.ranks] == [
        ("a100-1", "running"),
        ("a100-2", "running"),
        ("", "pending"),
    ]
    for rank in (0, 1):  # the running ranks' entrypoints are up
        until((gpu_nodes.workdir(ref, index=rank) / "started.json").exists, what="started")
    Attempt.objects.filter(pk=attempt.pk).update(pending_at=timezone.now() - dt.timedelta(days=1))
    reconcile_all()
    attempt.refresh_from_db()
    assert Job.objects.get(pk=job.pk).status == S.FAILED
    assert (attempt.failure, attempt.start_time) == ("deadline", None)  # never billed
    assert attempt.end_reason.startswith(
        "not all nodes started: 2 of 3 ranks running after the pending deadline"
    )
    api = gpu_nodes.api  # cancelled: the Job, its pods and Service, the running ranks' runners
    assert api.select("jobs") == api.select("pods") == api.select("services") == []
    for rank in (0, 1):
        until((gpu_nodes.workdir(ref, index=rank) / "exit.json").exists, what="the exit record")


# -- one rank's failure ends them all ----------------------------------------------------------


def test_one_ranks_failure_fails_the_attempt_with_its_code_and_ends_the_others(
    executor, gpu_nodes, apiserver
):
    code = (
        "import os, sys, time; time.sleep(0.5)\n"
        "if os.environ['SF_NODE_RANK'] == '1': sys.exit(3)\n"
        "time.sleep(60)"
    )
    ref = executor.submit(launch(nodes=2, total_gpus=8, entrypoint=script(code)))
    assert wait_for(executor, ref, {"Running"}).start_time is not None
    done = wait_for(executor, ref, {"Failed"})
    assert (done.exit_code, done.failure, done.details["failed_rank"]) == (3, "exit", 1)
    assert [(r["state"], r["exit_code"]) for r in done.details["ranks"]] == [
        ("killed", None),
        ("failed", 3),
    ]
    assert done.details["ranks"][1]["node"] == "a100-2" and done.end_time is not None
    conditions = {c["type"]: c for c in apiserver.get("jobs", ref)["status"]["conditions"]}
    assert conditions["Failed"]["reason"] == "PodFailurePolicy"
    assert (
        "failed with exit code 3 matching FailJob rule at index 0"
        in (conditions["Failed"]["message"])
    )
    # The Job controller deleted rank 0's pod, with the node it was on and its start (the
    # attempt's start is what RUNNING said), and the kubelet ended its runner.
    until(lambda: gpu_nodes.pods(ref)[0] is None, what="rank 0's pod deleted")
    final = executor.poll([ref])[ref]
    assert (states(final)[0], final.start_time) == (("", "killed", None), None)
    exit_file = gpu_nodes.workdir(ref, index=0) / "exit.json"
    until(exit_file.exists, what="rank 0's exit record")
    assert json.loads(exit_file.read_text())["reason"] == "killed by signal 15"


def test_the_rank_that_exited_on_its_own_failed_first_not_the_one_the_job_ended(
    executor, apiserver
):
    """Kubernetes times ends to the second: rank 0 ended by SIGTERM in the same second as
    rank 1's own exit is not the rank that failed."""
    ref = executor.submit(launch(nodes=2, total_gpus=2))
    job = apiserver.get("jobs", ref)
    apiserver.add("pods", pod_for(job, terminated(143, "Error"), suffix="aaaaa", index=0))
    apiserver.add("pods", pod_for(job, terminated(2, "Error"), suffix="bbbbb", index=1))
    obs = executor.poll([ref])[ref]
    assert (obs.native_state, obs.exit_code, obs.details["failed_rank"]) == ("Failed", 2, 1)
    assert [r["state"] for r in obs.details["ranks"]] == ["killed", "failed"]


def test_a_rank_on_a_silent_node_leaves_the_gang_unknown(executor, apiserver):
    ref = executor.submit(launch(nodes=2, total_gpus=2))
    job = apiserver.get("jobs", ref)
    lost = {"phase": "Unknown", "reason": "NodeLost", "message": "Node gpu-node-1 is gone"}
    apiserver.add("pods", pod_for(job, running(), suffix="aaaaa", index=0))
    apiserver.add("pods", pod_for(job, lost, suffix="bbbbb", index=1))
    obs = executor.poll([ref])[ref]
    assert obs.native_state not in executor.STATE_TABLE  # recorded; the job keeps its status
    assert obs.message == "NodeLost: Node gpu-node-1 is gone"
    assert [r["state"] for r in obs.details["ranks"]] == ["running", "running"]


def test_the_reconciler_fails_a_gang_with_the_rank_that_failed(
    use_executor, db, team, alice, k8s_settings, gpu_nodes
):
    cluster = Cluster.objects.create(name="gpu-k8s", kind="kubernetes", settings=k8s_settings)
    use_executor(KubernetesExecutor)
    job = queued_job(team, alice, total_gpus=8, nodes=2, cluster=cluster)
    code = (
        "import os, sys, time; time.sleep(1)\n"
        "if os.environ['SF_NODE_RANK'] == '1': sys.exit(5)\n"
        "time.sleep(60)"
    )
    spec = launch(run_id=job.run_id, job_id=job.pk, nodes=2, total_gpus=8, entrypoint=script(code))
    ref = KubernetesExecutor(cluster).submit(spec)
    attempt = with_attempt(job, S.PENDING, nodes=2, job_ref=ref, pending_at=timezone.now())
    seen = []
    deadline = time.monotonic() + 20
    while Job.objects.get(pk=job.pk).status not in S.terminal():
        assert time.monotonic() < deadline, f"stuck; saw {seen}"
        reconcile_all()
        status = Job.objects.get(pk=job.pk).status
        if not seen or seen[-1] != status:
            seen.append(status)
        time.sleep(0.05)
    attempt.refresh_from_db()
    assert seen[-1] == S.FAILED and S.RUNNING in seen
    assert (attempt.exit_code, attempt.failure) == (5, "exit")
    assert attempt.end_reason.startswith("rank 1 on a100-2 exited with code 5; every other rank")
    assert [(r["rank"], r["state"]) for r in attempt.ranks] == [(0, "killed"), (1, "failed")]


# -- GPU types ---------------------------------------------------------------------------------


def test_a_gpu_type_requires_the_nodes_whose_product_label_matches(
    apiserver, k8s_settings, gpu_nodes
):
    apiserver.add("nodes", node("a100-pcie", 2, product=A100_PCIE))  # not played: listed
    executor = executor_with(k8s_settings)
    a100 = executor.submit(launch(total_gpus=4, gpu_type="A100", entrypoint=script("pass")))
    affinity = apiserver.get("jobs", a100)["spec"]["template"]["spec"]["affinity"]
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": GPU_PRODUCT, "operator": "In", "values": [A100_PCIE, A100]}]}
    ]
    h100 = executor.submit(
        launch(run_id="a" * 16, total_gpus=8, gpu_type="h100", entrypoint=script("pass"))
    )
    for ref, where in ((a100, "a100-1"), (h100, "h100-1")):
        until(
            lambda ref=ref: (gpu_nodes.pod(ref) or {}).get("spec", {}).get("nodeName"), what="bound"
        )
        assert gpu_nodes.pod(ref)["spec"]["nodeName"] == where
    untyped = apiserver.get("jobs", executor.submit(launch(run_id="b" * 16)))
    assert "affinity" not in untyped["spec"]["template"]["spec"]


def test_a_gpu_type_no_node_has_now_is_a_launch_failure_worth_retrying(executor, apiserver):
    apiserver.add("nodes", node("h100-1", 8, product=H100))
    with pytest.raises(LaunchError) as failed:
        executor.submit(launch(total_gpus=1, gpu_type="mi300x"))
    assert not failed.value.permanent
    assert f"has mi300x GPUs now (node label {GPU_PRODUCT}: {H100})" in str(failed.value)
    assert apiserver.select("jobs") == []


def test_the_gpu_label_is_a_setting(apiserver, k8s_settings):
    apiserver.add("nodes", node("mi-1", 8, labels={"amd.com/gpu.product": "AMD-Instinct-MI300X"}))
    executor = executor_with(k8s_settings, gpu_label="amd.com/gpu.product")
    assert executor.capacity().nodes == (NodeCapacity("mi-1", 8, "AMD-Instinct-MI300X"),)
    job = apiserver.get("jobs", executor.submit(launch(gpu_type="mi300x")))
    affinity = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["key"] == "amd.com/gpu.product"


# -- images ------------------------------------------------------------------------------------


def test_a_job_image_is_allowed_only_where_the_cluster_says(k8s_settings):
    allowing = {**k8s_settings, "allowed_images": [ALLOWED]}
    KubernetesExecutor.check_request(allowing, nodes=4, image="registry.example.com/team/x:1")
    KubernetesExecutor.check_request(k8s_settings, nodes=4, image="")
    with pytest.raises(ValueError, match=r"allows images matching registry\.example\.com/team/"):
        KubernetesExecutor.check_request(allowing, nodes=1, image="docker.io/evil:latest")
    with pytest.raises(ValueError, match=r"allows no other \(its allowed_images setting is empty"):
        KubernetesExecutor.check_request(k8s_settings, nodes=1, image="registry.example.com/a:1")
    cluster = Cluster(name="k", kind="kubernetes", settings=allowing)
    check_request(cluster, nodes=2, image="registry.example.com/team/x:1")


def test_the_jobs_image_replaces_the_clusters_in_every_pod(apiserver, k8s_settings):
    executor = executor_with(k8s_settings, allowed_images=[ALLOWED])
    ref = executor.submit(launch(nodes=2, total_gpus=2, image="registry.example.com/team/train:v9"))
    (container,) = apiserver.get("jobs", ref)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/team/train:v9"


def test_an_image_no_longer_allowed_at_launch_is_refused_for_good(apiserver, k8s_settings):
    executor = executor_with(k8s_settings, allowed_images=["registry.example.com/other/*"])
    with pytest.raises(LaunchError) as refused:
        executor.submit(launch(image="registry.example.com/team/train:v9"))
    assert refused.value.permanent and "not allowed" in str(refused.value)
    assert apiserver.select("jobs") == []


@pytest.fixture
def k8s_cluster(db, apiserver, k8s_settings, team, grant):
    for name in ("a100-1", "a100-2"):
        apiserver.add("nodes", node(name, 4, product=A100))
    return grant(
        Cluster.objects.create(
            name="gpu-k8s",
            kind="kubernetes",
            settings={**k8s_settings, "allowed_images": [ALLOWED]},
        )
    )


def test_submit_refuses_an_image_the_cluster_does_not_allow_with_a_400(api, k8s_cluster):
    body = {"entrypoint": ["torchrun", "train.py"], "cluster": k8s_cluster.name, "gpus": 4}
    refused = api.post("/jobs", {**body, "nodes": 2, "image": "docker.io/evil/miner:latest"})
    assert_refused(refused, 400, "image docker.io/evil/miner:latest is not allowed")
    assert ALLOWED in refused.json()["detail"]
    assert not Job.objects.exists()
    accepted = api.post("/jobs", {**body, "nodes": 2, "image": "registry.example.com/team/t:1"})
    assert accepted.status_code == 201, accepted.content
    assert Job.objects.get().image == "registry.example.com/team/t:1"


def test_submit_sees_the_clusters_nodes_and_gpu_types(api, k8s_cluster):
    body = {"entrypoint": ["a"], "cluster": k8s_cluster.name}
    assert_refused(
        api.post("/jobs", {**body, "gpus": 2, "gpu_type": "h100"}),
        400,
        f"cluster gpu-k8s has no h100 GPUs; it has {A100}",
    )
    assert api.post("/jobs", {**body, "gpus": 4, "nodes": 2, "gpu_type": "a100"}).status_code == 201


# -- capacity ----------------------------------------------------------------------------------


def test_capacity_is_per_node_less_what_other_tenants_hold_there(executor, apiserver):
    apiserver.add("nodes", node("a100-1", 8, product=A100))
    apiserver.add("nodes", node("a100-2", 8, product=A100))
    apiserver.add("nodes", node("h100-1", 8, product=H100, ready=False))
    apiserver.add("nodes", node("cpu-1", 0))
    apiserver.add("pods", foreign_pod("vllm-0", "a100-1", 3), namespace="serving")
    apiserver.add("pods", foreign_pod("vllm-1", "a100-1", 6), namespace="serving")
    capacity = executor.capacity()
    assert capacity.nodes == (
        NodeCapacity("a100-1", 0, A100),  # 8 less 9 held: none, not fewer than none
        NodeCapacity("a100-2", 8, A100),
        NodeCapacity("cpu-1", 0, ""),
    )
    assert (capacity.total_gpus, capacity.ranks_share_nodes) == (8, True)
    assert capacity.gpu_types == [A100]
    assert capacity.largest_gang(4, "a100") == 2 and capacity.largest_gang(4, "h100") == 0


# -- one bootstrap exchange per rank -----------------------------------------------------------


def runner(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def post(client: Client, path: str, body: dict):
    return client.post(f"/api/v1/ingest/{path}", json.dumps(body), content_type="application/json")


@pytest.fixture
def gang_attempt(db, team, alice, k8s_settings) -> Attempt:
    cluster = Cluster.objects.create(name="gpu-k8s", kind="kubernetes", settings=k8s_settings)
    job = queued_job(team, alice, total_gpus=8, nodes=2, cluster=cluster)
    return with_attempt(job, S.PENDING, nodes=2, job_ref="sf-x-a1", pending_at=timezone.now())


def test_each_rank_exchanges_the_bootstrap_credential_once(gang_attempt):
    bootstrap = runner(bootstrap_token_for(gang_attempt))
    for rank in (1, 0):
        answer = post(bootstrap, "token", {"attempt": 1, "rank": rank})
        assert answer.status_code == 200, answer.content
        assert post(runner(answer.json()["token"]), "started", {"attempt": 1}).status_code == 200
    assert_refused(
        post(bootstrap, "token", {"attempt": 1, "rank": 1}), 409, "for rank 1; it works once"
    )
    assert_refused(post(bootstrap, "token", {"attempt": 1}), 409, "for rank 0")  # rank 0 left out
    assert_refused(post(bootstrap, "token", {"attempt": 1, "rank": 2}), 400, "from 0 to 1")
    assert_refused(post(bootstrap, "token", {"attempt": 1, "rank": "1"}), 400, "'1'")
    gang_attempt.refresh_from_db()
    assert gang_attempt.bootstrap_ranks == [1] and gang_attempt.bootstrap_used_at is not None
    # Rank 0's runner reports its start, but the others may still wait: the poll starts it.
    assert gang_attempt.start_time is None


def test_a_single_node_attempt_has_rank_0_alone(db, team, alice, k8s_settings):
    cluster = Cluster.objects.create(name="gpu-k8s", kind="kubernetes", settings=k8s_settings)
    attempt = with_attempt(queued_job(team, alice, cluster=cluster), S.PENDING, job_ref="sf-y-a1")
    bootstrap = runner(bootstrap_token_for(attempt))
    assert_refused(post(bootstrap, "token", {"attempt": 1, "rank": 1}), 400, "from 0 to 0")
    token = post(bootstrap, "token", {"attempt": 1, "rank": 0}).json()["token"]
    assert post(runner(token), "started", {"attempt": 1}).json()["start_time"] is not None


# -- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        ({"gpu_label": "gpu product"}, "'gpu_label'"),
        ({"allowed_images": ALLOWED}, "'allowed_images' must be a list"),
        ({"allowed_images": [""]}, "'allowed_images'"),
        ({"master_port": 0}, "'master_port'"),
        ({"master_port": "29500"}, "'master_port'"),
    ],
)
def test_the_new_settings_are_checked(k8s_settings, change, sentence):
    with pytest.raises(ValueError, match=sentence):
        KubernetesExecutor.validate_settings({**k8s_settings, **change})


def test_the_emulator_refuses_a_pod_failure_policy_the_real_server_would(executor, apiserver):
    manifest = job_manifest(executor.settings, "sf-bad-a1", launch(nodes=2, total_gpus=2))
    manifest["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    manifest["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] = "sidecar"
    with pytest.raises(ApiError) as refused:
        apiserver.add("jobs", manifest)
    assert refused.value.code == 422
    assert 'only "Never" is supported when podFailurePolicy is specified' in refused.value.message
    assert "must be one of the container or initContainer names" in refused.value.message
