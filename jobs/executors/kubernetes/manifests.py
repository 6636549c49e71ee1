"""What Starforge creates on a Kubernetes cluster for an attempt: the batch/v1 Job, the headless
Service of a multi-node Job, and their pod, built from a `LaunchSpec` and the cluster's settings
(its `DEFAULTS` filled in); the names and labels they carry; which images a job may name.

A job on N > 1 nodes is an Indexed Job (`completions = parallelism = N`): pod i is rank i, and
each runs its own runner. A headless Service of the Job's name, owned by the Job so that it goes
with it, gives pod i the DNS name `<job>-<i>.<job>` (the Job controller names an indexed pod's
host `<job>-<i>`; the template's `subdomain` is the Service): rank 0's is MASTER_ADDR, all of
them SF_NODE_ADDRS, and MASTER_PORT is the cluster's `master_port`. The rest of the rank
contract (`sf.contract.rank_env`) is the same in every pod, except the rank, which the downward
API reads from the pod's completion index. A `podFailurePolicy` fails the whole Job on any
rank's non-zero exit, and the Job controller then deletes the other pods.

A job's `gpu_type` becomes a node affinity `In` the GPU label values (`gpu_label`) that the
executor found matching on the cluster's nodes. A job may name its own image only where
`allowed_images` (fnmatch patterns, `*` crossing `/`) allows it.

Trust boundaries (docs/ARCHITECTURE.md, invariant 8). A pod's environment is the image's own plus
exactly `base_env` (HOME is the pod's work dir; PATH stays the image's, which knows where its
interpreter lives) and the launch spec's env: nothing of the server's. Pod specs are readable
by whoever may read pods in the namespace (`SPEC_IS_PUBLIC`), so the runner gets a one-time
bootstrap token, never the job token or record key. GPU visibility is the platform's: a 0-GPU
pod always gets NVIDIA_VISIBLE_DEVICES=void (the NVIDIA runtime would expose every GPU of the
node otherwise) and a job's own GPU visibility variables are dropped. The pod does not mount a
service account token unless the cluster names a `service_account` and sets
`automount_service_account_token: true`.
"""

import fnmatch
import hashlib
import re
from collections.abc import Sequence
from typing import Any

from django.conf import settings as django_settings
from sf.contract import rank_env

from jobs.executors.base import (
    TIME_LIMIT_BACKSTOP_S,
    LaunchSpec,
    base_env,
    passed_on,
    preempt_grace_s,
)

MANAGED_BY = "app.kubernetes.io/managed-by"
CONTAINER = "main"
WORK_DIR = "/sf"  # an emptyDir: writable whatever user the image runs as
# Finished Jobs are listed on every poll until Kubernetes deletes them, but one deleted before the
# reconciler saw its end would be failed as lost: a day outlasts any reasonable worker outage.
FINISHED_TTL_S = 24 * 3600
POD_FLUSH_S = 15  # past the runner's own SIGKILL of the job: its last lines and exit record
# Where the Job controller writes an indexed pod's index (its rank); 1.28 adds a label too.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# Anyone who may read pods in the namespace reads their env: the runner's secrets never go there.
SPEC_IS_PUBLIC = True


def attempt_labels(spec: LaunchSpec) -> dict[str, str]:
    """The labels of every object of an attempt: Starforge's mark and the attempt's ids."""
    return {
        MANAGED_BY: "starforge",
        "starforge.io/run-id": label_value(spec.run_id),
        "starforge.io/attempt": str(spec.attempt),
        "starforge.io/team": label_value(spec.team),
        "starforge.io/job-id": str(spec.job_id),
    }


def job_manifest(
    settings: dict, name: str, spec: LaunchSpec, gpu_products: Sequence[str] = ()
) -> dict:
    """The Job of an attempt; `gpu_products`, the GPU label values its nodes may have."""
    labels = attempt_labels(spec)
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": FINISHED_TTL_S,
        "template": {
            "metadata": {"labels": labels},
            "spec": pod_spec(settings, spec, gpu_products),
        },
    }
    if spec.nodes > 1:
        job_spec.update(
            completionMode="Indexed",
            completions=spec.nodes,
            parallelism=spec.nodes,
            # One rank's non-zero exit fails the whole Job at once, and the condition
            # names the pod and its code; the controller then deletes the other ranks.
            podFailurePolicy={
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER,
                            "operator": "NotIn",
                            "values": [0],
                        },
                    }
                ]
            },
        )
    deadlines = [int(settings["active_deadline_s"])] if settings.get("active_deadline_s") else []
    if spec.time_limit_s:
        # The Job's clock starts before its pod runs: the wait it may have, then the run
        # it may have, then the backstop past the reconciler's own stop at the limit.
        deadlines.append(spec.pending_deadline_s + spec.time_limit_s + TIME_LIMIT_BACKSTOP_S)
    if deadlines:
        job_spec["activeDeadlineSeconds"] = min(deadlines)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings["namespace"], "labels": labels},
        "spec": job_spec,
    }


def service_manifest(settings: dict, name: str, job_uid: str, spec: LaunchSpec) -> dict:
    """The headless Service that gives each pod of a multi-node Job its DNS name."""
    labels = attempt_labels(spec)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": settings["namespace"],
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job_uid,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "clusterIP": "None",
            # The attempt's own labels: the Job's pods and no other.
            "selector": {
                k: labels[k] for k in (MANAGED_BY, "starforge.io/run-id", "starforge.io/attempt")
            },
            # A rank resolves rank 0 while both start, before readiness says anything.
            "publishNotReadyAddresses": True,
        },
    }


def pod_spec(settings: dict, spec: LaunchSpec, gpu_products: Sequence[str] = ()) -> dict:
    """The pod of every rank of an attempt: its runner's container, where it may run, and the
    volumes it writes to."""
    container = _container(settings, spec)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        # The runner kills the job a preemption's grace after SIGTERM (SF_STOP_GRACE_S);
        # the kubelet's SIGKILL comes past that, so the runner can ship its last lines.
        "terminationGracePeriodSeconds": preempt_grace_s(settings) + POD_FLUSH_S,
        "enableServiceLinks": False,
        # No Kubernetes API credential in the pod unless an operator chose a service
        # account made for jobs and asked for its token (validated together).
        "automountServiceAccountToken": bool(settings.get("automount_service_account_token")),
        "containers": [container],
        "volumes": [{"name": "sf-work", "emptyDir": {}}],
    }
    optional = {
        "nodeSelector": settings.get("node_selector"),
        "tolerations": settings.get("tolerations"),
        "serviceAccountName": settings.get("service_account"),
        "imagePullSecrets": [{"name": s} for s in settings.get("image_pull_secrets") or []],
    }
    pod.update({k: v for k, v in optional.items() if v})
    if spec.nodes > 1:
        pod["subdomain"] = job_name(spec.name)  # the headless Service: pod i is <job>-<i>.<job>
    if gpu_products:
        term = {"key": settings["gpu_label"], "operator": "In", "values": [*gpu_products]}
        pod["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [term]}]
                }
            }
        }
    if settings.get("output_pvc"):
        # Run outputs and checkpoints outlive the pod: a resumed or retried attempt, and
        # follow-on jobs, find them under the same SF_OUTPUT_DIR.
        root = str(settings.get("output_root") or django_settings.SF_OUTPUT_ROOT)
        claim = {"claimName": settings["output_pvc"]}
        pod["volumes"].append({"name": "sf-outputs", "persistentVolumeClaim": claim})
        container["volumeMounts"].append({"name": "sf-outputs", "mountPath": root})
    return pod


def _container(settings: dict, spec: LaunchSpec) -> dict[str, Any]:
    """The runner's container: the image, the environment (base, the launch's own and, on
    several nodes, the rank contract) and the resources of one node's share."""
    env = base_env(WORK_DIR)
    del env["PATH"]  # the image's PATH: it knows where the image's interpreter lives
    env.update(passed_on(spec.env, spec_is_public=SPEC_IS_PUBLIC))
    if spec.gpus_per_node == 0:
        # Without a GPU limit the NVIDIA runtime would expose every GPU of the node.
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    entries: dict[str, dict[str, Any]] = {k: {"name": k, "value": v} for k, v in env.items()}
    if spec.nodes > 1:  # the platform's rank contract, over a job's own variable of a name
        for k, v in _rank_env(settings, job_name(spec.name), spec).items():
            entries[k] = (
                {"name": k, "valueFrom": v} if isinstance(v, dict) else {"name": k, "value": v}
            )
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image or settings["image"],
        "command": [settings["python"], "-m", "sf.runner"],
        "env": [entries[k] for k in sorted(entries)],
        "workingDir": WORK_DIR,
        "volumeMounts": [{"name": "sf-work", "mountPath": WORK_DIR}],
        # The tail of the runner's output becomes the terminated state's message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = _resources(settings["gpu_resource"], spec.gpus_per_node, spec.cpus, spec.memory_mb)
    if resources:
        container["resources"] = resources
    return container


def _rank_env(settings: dict, name: str, spec: LaunchSpec) -> dict[str, str | dict]:
    """The rank contract of every pod of a multi-node Job: values the same for each rank,
    and for the variables whose value is the rank itself, the pod's completion index."""
    addrs = [f"{name}-{i}.{name}" for i in range(spec.nodes)]
    port = int(settings["master_port"])
    first, second = (rank_env(rank, spec.nodes, spec.gpus_per_node, addrs, port) for rank in (0, 1))
    index = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
    return {k: index if (v, second[k]) == ("0", "1") else v for k, v in first.items()}


def job_name(name: str) -> str:
    """`name` as a DNS-1123 label of at most 63 characters, the same for the same input.

    Names that need changing get a digest of the original, so two names differing only in
    what was changed (case, punctuation, the truncated tail) cannot meet in one Job.
    """
    clean = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if clean == name and len(clean) <= 63:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{clean[:52].strip('-') or 'sf'}-{digest}"


def image_allowed(settings: dict, image: str) -> bool:
    """Whether a cluster's `allowed_images` lets a job name `image` (none: only its own)."""
    return any(fnmatch.fnmatchcase(image, p) for p in settings.get("allowed_images") or [])


def image_refusal(settings: dict, image: str) -> str:
    patterns = settings.get("allowed_images") or []
    if not patterns:
        return (
            f"this Kubernetes cluster runs every job in its own image ({settings.get('image')}) "
            "and allows no other (its allowed_images setting is empty); leave out --image"
        )
    return (
        f"image {image} is not allowed on this Kubernetes cluster; it allows images matching "
        f"{', '.join(patterns)}"
    )


def _resources(
    gpu_resource: str, gpus_per_node: int, cpus: int | None, memory_mb: int | None
) -> dict:
    """A container's (one node's) resources: GPUs as a limit alone (Kubernetes sets an
    extended resource's request to its limit), CPUs and memory asked for and capped alike."""
    asks = {}
    if cpus:
        asks["cpu"] = str(cpus)
    if memory_mb:
        asks["memory"] = f"{memory_mb}Mi"
    limits = {gpu_resource: str(gpus_per_node)} if gpus_per_node else {}
    if not (limits or asks):
        return {}
    return {"limits": {**limits, **asks}, **({"requests": asks} if asks else {})}


def label_value(value: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", value)[:63].strip("-_.")
