"""The Kubernetes executor through the real `kubernetes` client against the API emulator."""

import pytest

from jobs.executors import LaunchError
from jobs.executors.base import TIME_LIMIT_BACKSTOP_S
from jobs.executors.kubernetes import KubernetesExecutor
from jobs.executors.kubernetes.manifests import job_name, label_value
from jobs.models import Cluster
from jobs.states import JobStatus
from tests.engines.kubernetes.objects import (
    T0,
    T1,
    foreign_pod,
    job_condition,
    launch,
    node,
    pod_for,
    running,
    terminated,
    waiting,
)

pytestmark = pytest.mark.kubernetes
JOBS = "/apis/batch/v1/namespaces/default/jobs"
PODS = "/api/v1/namespaces/default/pods"


def test_submit_creates_one_labelled_job_running_the_runner(executor, apiserver):
    spec = launch(total_gpus=2)
    ref = executor.submit(spec)
    job = apiserver.get("jobs", ref)
    assert ref == spec.name == "sf-0123456789abcdef-a1"
    labels = {
        "app.kubernetes.io/managed-by": "starforge",
        "starforge.io/run-id": spec.run_id,
        "starforge.io/attempt": "1",
        "starforge.io/team": "vision",
        "starforge.io/job-id": "7",
    }
    assert job["metadata"]["labels"] == labels
    assert labels.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert job["spec"]["backoffLimit"] == 0
    assert "activeDeadlineSeconds" not in job["spec"]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/train:v2"
    assert container["command"][1:] == ["-m", "sf.runner"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    base = {"HOME": "/sf", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    own = {k: v for k, v in spec.env.items() if k not in ("SF_JOB_TOKEN", "SF_RECORD_KEY")}
    assert {e["name"]: e["value"] for e in container["env"]} == {**base, **own}
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize(("grace", "expected"), [(None, 120 + 15), (30, 30 + 15)])
def test_a_pods_termination_grace_is_the_clusters_preemption_grace_and_a_flush(
    k8s_settings, apiserver, grace, expected
):
    """Its deletion is a preemption's notice (SIGTERM): the runner kills the job a grace
    later, and the kubelet's SIGKILL comes after the runner's last flush."""
    settings = k8s_settings if grace is None else {**k8s_settings, "preempt_grace_s": grace}
    executor = KubernetesExecutor(Cluster(name="gpu-k8s", kind="kubernetes", settings=settings))
    ref = executor.submit(launch())
    pod = apiserver.get("jobs", ref)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == expected


def test_a_second_submit_adopts_the_existing_job(executor, apiserver):
    first = executor.submit(launch())
    second = executor.submit(launch())
    assert first == second
    assert len(apiserver.select("jobs")) == 1
    assert apiserver.count("POST", JOBS) == 2


def test_outputs_live_on_the_claim_named_by_output_pvc(apiserver, k8s_settings):
    settings = {**k8s_settings, "output_pvc": "runs", "output_root": "/mnt/runs"}
    executor = KubernetesExecutor(Cluster(name="k", kind="kubernetes", settings=settings))
    pod = apiserver.get("jobs", executor.submit(launch()))["spec"]["template"]["spec"]
    assert {"name": "sf-outputs", "persistentVolumeClaim": {"claimName": "runs"}} in pod["volumes"]
    (container,) = pod["containers"]
    assert {"name": "sf-outputs", "mountPath": "/mnt/runs"} in container["volumeMounts"]
    with pytest.raises(ValueError, match="output_pvc"):
        KubernetesExecutor.validate_settings({**k8s_settings, "output_pvc": "Runs/2"})


def test_a_cpu_only_job_asks_for_no_gpus_and_sees_none(executor, apiserver):
    ref = executor.submit(launch(total_gpus=0))
    (container,) = apiserver.get("jobs", ref)["spec"]["template"]["spec"]["containers"]
    assert "resources" not in container
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in container["env"]


def test_cluster_settings_reach_the_pod(apiserver, k8s_settings):
    settings = {
        **k8s_settings,
        "gpu_resource": "amd.com/gpu",
        "node_selector": {"gpu.type": "mi300x"},
        "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "active_deadline_s": 3600,
        "service_account": "trainer",
        "image_pull_secrets": ["registry-creds"],
    }
    executor = KubernetesExecutor(Cluster(name="amd", kind="kubernetes", settings=settings))
    job = apiserver.get("jobs", executor.submit(launch(total_gpus=8)))
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    assert pod["containers"][0]["resources"] == {"limits": {"amd.com/gpu": "8"}}
    assert pod["nodeSelector"] == {"gpu.type": "mi300x"}
    assert pod["tolerations"] == settings["tolerations"]
    assert pod["serviceAccountName"] == "trainer"
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]


def test_a_time_limit_gives_the_job_an_active_deadline_past_its_wait_and_its_run(
    executor, apiserver, k8s_settings
):
    # The Job's clock runs from its creation: the pending deadline, the limit, the backstop.
    spec = launch(time_limit_s=600, pending_deadline_s=300)
    job = apiserver.get("jobs", executor.submit(spec))
    assert job["spec"]["activeDeadlineSeconds"] == 300 + 600 + TIME_LIMIT_BACKSTOP_S
    # A cluster's own shorter deadline still holds.
    short = KubernetesExecutor(
        Cluster(
            name="short", kind="kubernetes", settings={**k8s_settings, "active_deadline_s": 120}
        )
    )
    job = apiserver.get("jobs", short.submit(launch(run_id="fedcba9876543210", time_limit_s=600)))
    assert job["spec"]["activeDeadlineSeconds"] == 120


def test_an_invalid_job_is_refused_for_good_with_the_apis_message(executor, monkeypatch):
    monkeypatch.setattr("jobs.executors.kubernetes.manifests.label_value", lambda value: "-bad-")
    with pytest.raises(LaunchError) as refused:
        executor.submit(launch())
    assert refused.value.permanent
    assert "422" in str(refused.value) and "is invalid: [metadata.labels" in str(refused.value)


def test_an_unreachable_api_is_a_transient_launch_failure(executor, apiserver):
    apiserver.close()
    with pytest.raises(LaunchError) as failed:
        executor.submit(launch())
    assert not failed.value.permanent
    assert "cannot reach the Kubernetes API" in str(failed.value)
    assert "Connection refused" in str(failed.value)


@pytest.mark.parametrize(
    ("code", "reason", "message", "permanent"),
    [
        (500, "InternalError", "etcdserver: request timed out", False),
        (429, "TooManyRequests", "the server has received too many requests", False),
        (
            403,
            "Forbidden",
            'jobs.batch "x" is forbidden: exceeded quota: gpu-quota, requested: '
            "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: "
            "requests.nvidia.com/gpu=8",
            False,
        ),
        (
            403,
            "Forbidden",
            'jobs.batch is forbidden: User "system:serviceaccount:sf:worker" cannot create '
            'resource "jobs" in API group "batch" in the namespace "default"',
            True,
        ),
        (404, "NotFound", 'namespaces "ml" not found', True),
    ],
)
def test_api_refusals_say_whether_trying_again_helps(
    executor, apiserver, code, reason, message, permanent
):
    apiserver.fail("POST", JOBS, code, reason, message)
    with pytest.raises(LaunchError) as refused:
        executor.submit(launch())
    assert refused.value.permanent == permanent
    assert f"{code} " in str(refused.value) and message in str(refused.value)


def test_a_broken_kubeconfig_is_reported_not_raised(apiserver, k8s_settings, tmp_path):
    (tmp_path / "garbage").write_text("not: [a, kubeconfig")
    settings = {**k8s_settings, "kubeconfig": str(tmp_path / "garbage")}
    executor = KubernetesExecutor(Cluster(name="broken", kind="kubernetes", settings=settings))
    capacity = executor.capacity()
    assert not capacity.reachable
    assert "bad Kubernetes configuration: cannot load" in capacity.message
    with pytest.raises(LaunchError) as failed:
        executor.submit(launch())
    assert not failed.value.permanent


def test_find_reports_only_jobs_that_exist(executor):
    assert executor.find("sf-0123456789abcdef-a1") is None
    ref = executor.submit(launch())
    assert executor.find("sf-0123456789abcdef-a1") == ref


def test_poll_is_one_list_of_jobs_and_one_of_pods_whatever_the_count(executor, apiserver):
    refs = [executor.submit(launch(run_id=f"{i:016x}")) for i in range(5)]
    for ref in refs:
        apiserver.add("pods", pod_for(apiserver.get("jobs", ref), running()))
    apiserver.add("jobs", {"metadata": {"name": "not-ours"}, "spec": _bare_template()})
    before = len(apiserver.requests)
    seen = executor.poll(refs + ["sf-gone-a1"])
    assert sorted(seen) == sorted(refs)
    assert {o.native_state for o in seen.values()} == {"Running"}
    sent = apiserver.requests[before:]
    assert [(r.method, r.path) for r in sent] == [("GET", JOBS), ("GET", PODS)]
    assert {r.query["labelSelector"] for r in sent} == {"app.kubernetes.io/managed-by=starforge"}


def test_a_job_without_a_pod_yet_is_pending(executor):
    ref = executor.submit(launch())
    obs = executor.poll([ref])[ref]
    assert obs.native_state == "Pending"
    assert executor.STATE_TABLE[obs.native_state] == JobStatus.PENDING


@pytest.mark.parametrize(
    ("status", "state", "mapped", "expect"),
    [
        (
            waiting("ImagePullBackOff", 'Back-off pulling image "registry.example/train:v2"'),
            "Pending/ImagePullBackOff",
            JobStatus.PENDING,
            {"message": 'ImagePullBackOff: Back-off pulling image "registry.example/train:v2"'},
        ),
        (
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    }
                ],
            },
            "Pending/Unschedulable",
            JobStatus.PENDING,
            {"message": "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."},
        ),
        (
            terminated(137, "OOMKilled"),
            "Failed/OOMKilled",
            JobStatus.FAILED,
            {"failure": "oom", "exit_code": -9},
        ),
        (
            terminated(
                137,
                "Error",
                reason="Evicted",
                message="The node was low on resource: memory. ",
            ),
            "Failed/Evicted",
            JobStatus.FAILED,
            {"failure": "lost", "message": "Evicted: The node was low on resource: memory."},
        ),
        (
            {"phase": "Unknown", "reason": "NodeLost", "message": "Node gpu-node-1 is gone"},
            "Unknown",
            None,
            {"message": "NodeLost: Node gpu-node-1 is gone"},
        ),
        (terminated(0, "Completed"), "Succeeded", JobStatus.SUCCEEDED, {"exit_code": 0}),
        (
            terminated(1, "Error"),
            "Failed",
            JobStatus.FAILED,
            {"failure": "exit", "exit_code": 1},
        ),
    ],
    ids=["image-pull", "unschedulable", "oom", "evicted", "unknown", "exit-0", "exit-1"],
)
def test_each_pod_situation_maps_right(executor, apiserver, status, state, mapped, expect):
    ref = executor.submit(launch())
    apiserver.add("pods", pod_for(apiserver.get("jobs", ref), status))
    obs = executor.poll([ref])[ref]
    assert obs.native_state == state
    assert executor.STATE_TABLE.get(state) == mapped
    assert {key: getattr(obs, key) for key in expect} == expect


def test_ended_attempts_carry_the_containers_start_and_end(executor, apiserver):
    ref = executor.submit(launch())
    apiserver.add("pods", pod_for(apiserver.get("jobs", ref), terminated(3, "Error")))
    obs = executor.poll([ref])[ref]
    assert (obs.start_time.isoformat(), obs.end_time.isoformat()) == (
        T0.replace("Z", "+00:00"),
        T1.replace("Z", "+00:00"),
    )


def test_a_completed_job_whose_pod_is_gone_still_succeeds(executor, apiserver):
    ref = executor.submit(launch())
    apiserver.mutate("jobs", ref, lambda j: job_condition(j, "Complete", "CompletionsReached", ""))
    obs = executor.poll([ref])[ref]
    assert (obs.native_state, obs.exit_code) == ("Succeeded", 0)


def test_the_newest_pod_speaks_for_the_job(executor, apiserver):
    ref = executor.submit(launch())
    job = apiserver.get("jobs", ref)
    apiserver.add("pods", pod_for(job, terminated(1, "Error"), suffix="old00"))
    apiserver.add("pods", pod_for(job, running(), suffix="new00", created=T1))
    assert executor.poll([ref])[ref].native_state == "Running"


def test_cancel_deletes_the_job_and_its_pods_and_is_idempotent(executor, apiserver):
    ref = executor.submit(launch())
    apiserver.add("pods", pod_for(apiserver.get("jobs", ref), running()))
    executor.cancel(ref)
    assert apiserver.select("jobs") == [] and apiserver.select("pods") == []
    executor.cancel(ref)  # 404 now: nothing to do, no error
    assert executor.find(ref) is None
    deletes = [r for r in apiserver.requests if r.method == "DELETE"]
    assert [r.query.get("propagationPolicy") for r in deletes] == ["Foreground"] * 2


def test_capacity_counts_ready_schedulable_matching_nodes(apiserver, k8s_settings):
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    for n in [
        node("a100-1", 8, labels={"pool": "a100"}),
        node("a100-2", 8, labels={"pool": "a100"}, taints=[taint]),
        node("a100-3", 8, labels={"pool": "a100"}, ready=False),
        node("a100-4", 8, labels={"pool": "a100"}, unschedulable=True),
        node("a100-5", 8, labels={"pool": "a100"}, taints=[{**taint, "key": "dedicated"}]),
        node("h100-1", 8, labels={"pool": "h100"}),
        node("cpu-1", 0, labels={"pool": "a100"}),
    ]:
        apiserver.add("nodes", n)
    settings = {
        **k8s_settings,
        "node_selector": {"pool": "a100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    }
    executor = KubernetesExecutor(Cluster(name="a100", kind="kubernetes", settings=settings))
    capacity = executor.capacity()
    assert (capacity.reachable, capacity.total_gpus, capacity.virtual) == (True, 16, False)
    (nodes,) = [r for r in apiserver.requests if r.path == "/api/v1/nodes"]
    assert nodes.query["labelSelector"] == "pool=a100"


def test_capacity_leaves_out_gpus_other_tenants_hold(executor, apiserver):
    apiserver.add("nodes", node("gpu-1", 8))
    apiserver.add("nodes", node("gpu-2", 8, ready=False))
    apiserver.add("pods", foreign_pod("vllm-0", "gpu-1", 3), namespace="serving")
    apiserver.add("pods", foreign_pod("vllm-1", "gpu-2", 4), namespace="serving")
    apiserver.add("pods", foreign_pod("batch-0", "gpu-1", 2, phase="Succeeded"), namespace="b")
    ours = pod_for(apiserver.get("jobs", executor.submit(launch(total_gpus=4))), running())
    ours["spec"]["nodeName"] = "gpu-1"  # the scheduler already counts Starforge's own jobs
    apiserver.add("pods", ours)
    assert executor.capacity().total_gpus == 8 - 3


def test_capacity_without_rbac_for_all_pods_still_counts_nodes(executor, apiserver):
    apiserver.add("nodes", node("gpu-1", 8))
    apiserver.fail("GET", "/api/v1/pods", 403, "Forbidden", "pods is forbidden")
    assert executor.capacity().total_gpus == 8


def test_capacity_of_an_unreachable_api_says_why(executor, apiserver):
    apiserver.close()
    capacity = executor.capacity()
    assert not capacity.reachable
    assert "cannot reach the Kubernetes API" in capacity.message


def test_job_names_are_dns_labels_and_stay_deterministic():
    assert job_name("sf-0123456789abcdef-a1") == "sf-0123456789abcdef-a1"
    odd = job_name("SF_Run.42-a1")
    assert odd == job_name("SF_Run.42-a1") != job_name("sf_run.42-a1")
    assert odd.startswith("sf-run-42-a1-")
    long = job_name("sf-" + "x" * 80 + "-a12")
    assert len(long) <= 63 and long != job_name("sf-" + "x" * 80 + "-a13")
    assert label_value("-ml_team-") == "ml_team" and len(label_value("t" * 80)) == 63


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        ({"context": None}, "needs 'context'"),
        ({"in_cluster": True}, "not both"),
        ({"image": ""}, "'image'"),
        ({"namespace": "ML Jobs"}, "'namespace'"),
        ({"gpu_resource": "nvidia gpu"}, "'gpu_resource'"),
        ({"node_selector": {"pool": 1}}, "'node_selector'"),
        ({"tolerations": [{"key": "x", "operator": "Maybe"}]}, "'operator'"),
        ({"tolerations": [{"kye": "x"}]}, "'kye'"),
        ({"active_deadline_s": 0}, "'active_deadline_s'"),
        ({"image_pull_secrets": "creds"}, "'image_pull_secrets'"),
        ({"namepsace": "ml"}, "Unknown Kubernetes setting 'namepsace'"),
    ],
)
def test_settings_are_checked_with_a_clear_sentence(k8s_settings, change, sentence):
    settings = {k: v for k, v in {**k8s_settings, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=sentence):
        KubernetesExecutor.validate_settings(settings)


def test_valid_settings_pass(k8s_settings):
    KubernetesExecutor.validate_settings(k8s_settings)
    KubernetesExecutor.validate_settings({"in_cluster": True, "image": "train:v2"})


def _bare_template() -> dict:
    return {
        "template": {
            "spec": {"restartPolicy": "Never", "containers": [{"name": "x", "image": "busybox"}]}
        }
    }


def test_live_lists_the_starforge_jobs_that_have_not_ended(executor, apiserver):
    up, waiting_, done = (executor.submit(launch(run_id=c * 16)) for c in "abc")
    apiserver.add("pods", pod_for(apiserver.get("jobs", up), running()))
    apiserver.add("pods", pod_for(apiserver.get("jobs", done), terminated(0, "Completed")))
    apiserver.add("jobs", {"metadata": {"name": "not-ours"}, "spec": _bare_template()})
    held = executor.starforge_objects()
    assert {ref: o.native_state for ref, o in held.items()} == {
        up: "Running",
        waiting_: "Pending",
    }
    assert all(o.name == ref for ref, o in held.items())
