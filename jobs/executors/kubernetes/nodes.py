"""A Kubernetes cluster's room for Starforge's pods, read from the API's nodes and pods: which
nodes take them, the GPUs each has that other tenants' pods do not hold, and the GPU products
(values of the cluster's `gpu_label`) they carry. Pure: the executor lists, this module reads."""

from kubernetes.utils import parse_quantity

from jobs.executors.base import Capacity, NodeCapacity
from jobs.executors.kubernetes.manifests import MANAGED_BY

# The pods whose GPUs are not Starforge's to use: live ones that Starforge did not start.
OTHERS_PODS = f"{MANAGED_BY}!=starforge"
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def node_capacity(
    nodes: list[dict], held: dict[str, int], gpu_label: str, gpu_resource: str
) -> Capacity:
    """Each of the usable `nodes` with the GPUs left of it once others' pods (`held`, by node
    name) are taken off, and its GPU product; a Job's pods may share a node, as the Kubernetes
    scheduler places them."""
    each = tuple(
        NodeCapacity(
            n["metadata"]["name"],
            max(
                _gpus(n["status"].get("allocatable", {}), gpu_resource)
                - held.get(n["metadata"]["name"], 0),
                0,
            ),
            (n["metadata"].get("labels") or {}).get(gpu_label, ""),
        )
        for n in nodes
    )
    return Capacity(
        reachable=True,
        total_gpus=sum(n.gpus for n in each),
        nodes=each,
        ranks_share_nodes=True,
    )


def usable(node: dict, tolerations: list[dict]) -> bool:
    """Whether a node takes new pods of the cluster's: Ready, schedulable, and every taint that
    would keep a pod off tolerated by the cluster's `tolerations`."""
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions", [])
    )
    return (
        ready
        and not node.get("spec", {}).get("unschedulable")
        and all(_tolerated(t, tolerations) for t in node.get("spec", {}).get("taints", []))
    )


def gpus_held(pods: list[dict], nodes: set[str], gpu_resource: str) -> dict[str, int]:
    """GPUs the containers of `pods` ask for, by node, on `nodes` only."""
    held: dict[str, int] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if node in nodes:
            for container in pod["spec"].get("containers", []):
                asks = container.get("resources", {})
                held[node] = held.get(node, 0) + _gpus(
                    {**asks.get("requests", {}), **asks.get("limits", {})}, gpu_resource
                )
    return held


def gpu_products(nodes: list[dict], gpu_label: str) -> set[str]:
    """The values of the GPU label on `nodes`, "" for a node without one."""
    return {(n["metadata"].get("labels") or {}).get(gpu_label, "") for n in nodes}


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _gpus(resources: dict, resource: str) -> int:
    value = resources.get(resource)
    return int(parse_quantity(value)) if value else 0


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True  # PreferNoSchedule only steers the scheduler
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False
