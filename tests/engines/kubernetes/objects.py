"""Builders for the objects tests put into the emulator, shaped as a real cluster reports them.

Statuses follow what `kubectl get -o json` shows on Kubernetes 1.31 for each situation (the
conditions, reasons and messages are copied from real clusters), so the executor is tested
against the shapes it will meet, not against a simplification of them.
"""

import dataclasses
import json

from jobs.executors.base import LaunchSpec

T0, T1 = "2025-03-01T10:00:00Z", "2025-03-01T10:05:00Z"
IMAGE = "registry.example/train:v2"
# The label GPU feature discovery puts on a GPU node, and values it writes there.
GPU_PRODUCT = "nvidia.com/gpu.product"
A100, A100_PCIE, H100 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-PCIE-40GB", "NVIDIA-H100-80GB-HBM3"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def launch(**fields) -> LaunchSpec:
    """A LaunchSpec as jobs.loops.launcher.launch_spec builds one, for an offline runner."""
    run_id = fields.pop("run_id", "0123456789abcdef")
    attempt = fields.pop("attempt", 1)
    entrypoint = fields.pop("entrypoint", ["python", "train.py"])
    values = {
        "name": f"sf-{run_id}-a{attempt}",
        "job_id": 7,
        "team": "vision",
        "run_id": run_id,
        "attempt": attempt,
        "total_gpus": 1,
        "entrypoint": entrypoint,
        "env": {
            "SF_API_URL": "",
            "SF_JOB_TOKEN": "7.1:token",
            "SF_JOB_ID": "7",
            "SF_RUN_ID": run_id,
            "SF_ATTEMPT": str(attempt),
            "SF_ENTRYPOINT": json.dumps(entrypoint),
            "SF_SNAPSHOT": "",
        },
    }
    if "team" in {f.name for f in dataclasses.fields(LaunchSpec)}:
        values["team"] = "vision"
    values.update(fields)
    return LaunchSpec(**values)  # type: ignore[arg-type]


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    found = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": T1}
    if reason:
        found["reason"] = reason
    if message:
        found["message"] = message
    return found


def pod_for(
    job: dict,
    status: dict,
    suffix: str = "x7k2q",
    created: str = T0,
    index: int | None = None,
    node_name: str = "gpu-node-1",
) -> dict:
    """The pod the Job controller makes for `job` (as stored by the emulator), with `status`;
    with `index`, that index's pod of an Indexed Job."""
    template = job["spec"]["template"]
    name, labels = job["metadata"]["name"], dict(template["metadata"]["labels"])
    extra = {}
    if index is not None:
        name = f"{name}-{index}"
        labels[COMPLETION_INDEX] = str(index)
        extra["annotations"] = {COMPLETION_INDEX: str(index)}
    return {
        "metadata": {
            "name": f"{name}-{suffix}",
            "labels": labels,
            **extra,
            "creationTimestamp": created,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job["metadata"]["name"],
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {**template["spec"], "nodeName": node_name},
        "status": status,
    }


def container(state: dict, ready: bool = False) -> dict:
    return {
        "name": "main",
        "state": state,
        "lastState": {},
        "ready": ready,
        "restartCount": 0,
        "image": IMAGE,
        "imageID": "",
        "started": "running" in state,
    }


def scheduled(phase: str, state: dict, **fields) -> dict:
    """A pod on a node, its container in `state`."""
    running = "running" in state
    return {
        "phase": phase,
        "conditions": [
            condition("PodReadyToStartContainers", "True" if phase != "Pending" else "False"),
            condition("Initialized"),
            condition("Ready", "True" if running else "False"),
            condition("ContainersReady", "True" if running else "False"),
            condition("PodScheduled"),
        ],
        "hostIP": "10.0.3.17",
        "podIP": "10.244.2.31",
        "startTime": T0,
        "containerStatuses": [container(state, ready=running)],
        "qosClass": "BestEffort",
        **fields,
    }


def waiting(reason: str, message: str = "") -> dict:
    state = {"reason": reason, **({"message": message} if message else {})}
    return scheduled("Pending", {"waiting": state})


def not_scheduled(reason: str, message: str) -> dict:
    return {
        "phase": "Pending",
        "conditions": [condition("PodScheduled", "False", reason, message)],
        "qosClass": "BestEffort",
    }


def running(started: str = T0) -> dict:
    return scheduled("Running", {"running": {"startedAt": started}})


def terminated(
    code: int,
    container_reason: str,
    log_tail: str = "",
    started: str = T0,
    finished: str = T1,
    **pod_fields,
) -> dict:
    """An ended container; `log_tail` is its termination message (FallbackToLogsOnError)."""
    state = {
        "exitCode": code,
        "reason": container_reason,
        "startedAt": started,
        "finishedAt": finished,
        "containerID": "containerd://4f1c0e9d",
    }
    if log_tail:
        state["message"] = log_tail
    phase = "Succeeded" if code == 0 else "Failed"
    return scheduled(phase, {"terminated": state}, **pod_fields)


def job_condition(job: dict, kind: str, reason: str, message: str) -> None:
    """Give a stored Job the conditions the controller writes when it ends (use with mutate)."""
    target = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
    job["status"]["conditions"] = [
        condition(target, "True", reason, message),
        condition(kind, "True", reason, message),
    ]
    job["status"].update(
        {"startTime": T0, "active": 0, "ready": 0},
        **({"completionTime": T1, "succeeded": 1} if kind == "Complete" else {"failed": 1}),
    )


def node(
    name: str,
    gpus: int,
    *,
    ready: bool = True,
    labels: dict | None = None,
    unschedulable: bool = False,
    taints: list[dict] | None = None,
    resource: str = "nvidia.com/gpu",
    product: str = "",
) -> dict:
    """A node with `gpus` allocatable; `product`, its GPU product label (GPU_PRODUCT)."""
    allocatable = {"cpu": "94", "memory": "1980Gi", "pods": "110"}
    if product:
        labels = {GPU_PRODUCT: product, **(labels or {})}
    if gpus:
        allocatable[resource] = str(gpus)
    spec: dict = {"podCIDR": "10.244.2.0/24"}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
        },
        "spec": spec,
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition(
                    "Ready",
                    "True" if ready else "Unknown",
                    "KubeletReady" if ready else "NodeStatusUnknown",
                    "kubelet is posting ready status"
                    if ready
                    else "Kubelet stopped posting node status.",
                ),
            ],
        },
    }


def foreign_pod(name: str, node_name: str, gpus: int, phase: str = "Running") -> dict:
    """Another tenant's pod holding GPUs on a node (not started by Starforge)."""
    return {
        "metadata": {"name": name, "labels": {"app": "inference"}},
        "spec": {
            "nodeName": node_name,
            "containers": [
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:v0.8.0",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
        "status": {"phase": phase},
    }
