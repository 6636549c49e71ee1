"""A Kubernetes cluster's settings: the keys it knows, their defaults, and the check that runs
before a `Cluster` of this kind is saved (and again as its executor is made)."""

import re

DEFAULTS = {
    "namespace": "default",
    "gpu_resource": "nvidia.com/gpu",
    "gpu_label": "nvidia.com/gpu.product",
    "python": "python",
    "master_port": 29500,  # torch.distributed's usual rendezvous port
}
SETTINGS = {
    "context",
    "in_cluster",
    "kubeconfig",
    "namespace",
    "image",
    "allowed_images",
    "gpu_resource",
    "gpu_label",
    "node_selector",
    "tolerations",
    "python",
    "api_url",
    "active_deadline_s",
    "service_account",
    "image_pull_secrets",
    "output_pvc",
    "automount_service_account_token",
    "master_port",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}


def check_settings(settings: dict) -> None:
    """Raise ValueError with one sentence on the first thing wrong with a cluster's settings."""
    unknown = sorted(set(settings) - SETTINGS)
    if unknown:
        raise ValueError(
            f"Unknown Kubernetes setting {unknown[0]!r}; known: {', '.join(sorted(SETTINGS))}."
        )
    _check_connection(settings)
    _check_pod_settings(settings)


def _check_connection(settings: dict) -> None:
    in_cluster, context = settings.get("in_cluster", False), settings.get("context")
    if not isinstance(in_cluster, bool):
        raise ValueError("Kubernetes setting 'in_cluster' must be true or false.")
    if in_cluster and context:
        raise ValueError("Give a Kubernetes cluster 'context' or 'in_cluster': true, not both.")
    if not (in_cluster or context):
        raise ValueError(
            "A Kubernetes cluster needs 'context' (a kubeconfig context) or 'in_cluster': true."
        )
    for key in ("context", "kubeconfig", "service_account", "api_url"):
        if key in settings and not (isinstance(settings[key], str) and settings[key]):
            raise ValueError(f"Kubernetes setting {key!r} must be a non-empty string.")
    mount = settings.get("automount_service_account_token", False)
    if not isinstance(mount, bool):
        raise ValueError(
            "Kubernetes setting 'automount_service_account_token' must be true or false."
        )
    if mount and not settings.get("service_account"):
        raise ValueError(
            "Kubernetes setting 'automount_service_account_token' needs 'service_account': "
            "jobs would otherwise get the namespace's default service account's API access."
        )


def _check_pod_settings(settings: dict) -> None:
    merged = {**DEFAULTS, **settings}
    deadline = settings.get("active_deadline_s", 1)
    checks = [
        (
            isinstance(merged.get("image"), str) and merged["image"].strip(),
            "Kubernetes setting 'image' (the job image, with sf installed) is required.",
        ),
        (
            isinstance(merged["namespace"], str) and DNS_LABEL.match(merged["namespace"]),
            "Kubernetes setting 'namespace' must be a DNS-1123 label such as 'ml-jobs'.",
        ),
        (
            isinstance(merged["gpu_resource"], str)
            and QUALIFIED_NAME.match(merged["gpu_resource"]),
            "Kubernetes setting 'gpu_resource' must be a resource name such as 'nvidia.com/gpu'.",
        ),
        (
            isinstance(merged["gpu_label"], str) and QUALIFIED_NAME.match(merged["gpu_label"]),
            "Kubernetes setting 'gpu_label' must be a node label name such as "
            "'nvidia.com/gpu.product'.",
        ),
        (
            _is_name_list(settings.get("allowed_images", [])),
            "Kubernetes setting 'allowed_images' must be a list of image patterns such as "
            "'registry.example.com/team/*:*'.",
        ),
        (
            isinstance(merged["master_port"], int)
            and not isinstance(merged["master_port"], bool)
            and 1 <= merged["master_port"] <= 65535,
            "Kubernetes setting 'master_port' must be a TCP port number (1 to 65535).",
        ),
        (
            isinstance(merged["python"], str) and merged["python"].strip(),
            "Kubernetes setting 'python' must name the image's Python interpreter.",
        ),
        (
            _is_str_map(settings.get("node_selector", {})),
            "Kubernetes setting 'node_selector' must map label names to string values.",
        ),
        (
            isinstance(deadline, int) and not isinstance(deadline, bool) and deadline > 0,
            "Kubernetes setting 'active_deadline_s' must be a positive whole number of seconds.",
        ),
        (
            settings.get("output_pvc") is None
            or (
                isinstance(settings["output_pvc"], str) and DNS_LABEL.match(settings["output_pvc"])
            ),
            "Kubernetes setting 'output_pvc' must name a PersistentVolumeClaim such as 'runs'.",
        ),
        (
            _is_name_list(settings.get("image_pull_secrets", [])),
            "Kubernetes setting 'image_pull_secrets' must be a list of secret names.",
        ),
    ]
    for ok, sentence in checks:
        if not ok:
            raise ValueError(sentence)
    _check_tolerations(settings.get("tolerations", []))


def _check_tolerations(tolerations: object) -> None:
    if not isinstance(tolerations, list) or not all(isinstance(t, dict) for t in tolerations):
        raise ValueError("Kubernetes setting 'tolerations' must be a list of toleration objects.")
    for t in tolerations:
        extra = sorted(set(t) - TOLERATION_KEYS)
        if extra:
            raise ValueError(
                f"Kubernetes toleration field {extra[0]!r} is not one of "
                f"{', '.join(sorted(TOLERATION_KEYS))}."
            )
        if t.get("operator", "Equal") not in ("Equal", "Exists"):
            raise ValueError("A Kubernetes toleration's 'operator' must be 'Equal' or 'Exists'.")
        if t.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ValueError(
                "A Kubernetes toleration's 'effect' must be NoSchedule, PreferNoSchedule or "
                "NoExecute."
            )
        if t.get("operator") == "Exists" and t.get("value"):
            raise ValueError("A Kubernetes toleration with operator 'Exists' takes no 'value'.")


def _is_str_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _is_name_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)
