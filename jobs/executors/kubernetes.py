"""Kubernetes executor: each attempt is one batch/v1 Job whose pods run the job-side runner, one
pod for a single-node job, one per rank for a job on several nodes.

The Job is named from the attempt's deterministic name (a DNS-1123 label), so a second submit
of the same attempt meets 409 AlreadyExists and adopts the first Job: at most one launch per
attempt. Every Job and its pod template carry `app.kubernetes.io/managed-by=starforge` plus the
run id, attempt, team and job id; `backoffLimit: 0` and `restartPolicy: Never` leave retries
to the ledger, where they are counted and metered.

A job on N > 1 nodes is an Indexed Job (`completions = parallelism = N`): pod i is rank i, and
each runs its own runner (`RANK_RUNNERS`). A headless Service of the Job's name, owned by the
Job so that it goes with it, gives pod i the DNS name `<job>-<i>.<job>` (the Job controller
names an indexed pod's host `<job>-<i>`; the template's `subdomain` is the Service): rank 0's
is MASTER_ADDR, all of them SF_NODE_ADDRS, and MASTER_PORT is the cluster's `master_port`. The
rest of the rank contract (`sf.contract.rank_env`) is the same in every pod, except the rank,
which the downward API reads from the pod's completion index. A `podFailurePolicy` fails the
whole Job on any rank's non-zero exit, and the Job controller then deletes the other pods.
The attempt is RUNNING only once every rank runs, from the last rank's start; while some ranks
run and others wait it stays PENDING, saying "not all nodes started: k of N running", so the
pending deadline ends a gang that never fully starts. The reconciler learns each rank's state
from `details["ranks"]` and which failed first from `details["failed_rank"]`.

A job's `gpu_type` picks nodes by the node label named by `gpu_label` (GPU feature discovery's
`nvidia.com/gpu.product`, values like NVIDIA-A100-SXM4-80GB). A nodeSelector needs the one
exact value, so submit lists the cluster's nodes and requires, by node affinity `In`, one of
the values there that `gpu_type_matches` accepts ("a100" takes every A100 product). A job may
name its own image only where `allowed_images` (fnmatch patterns, `*` crossing `/`) allows it:
refused at submit (`check_request`) and again at launch, since the list may have narrowed.

A poll is one labelled list of Jobs and one of Pods in the cluster's namespace, however many
attempts are live. Native states are `Phase[/Reason]` strings read from the Job's conditions,
the pod's phase, reason and conditions, and the `main` container's state; `STATE_TABLE` lists
every one this module reports on purpose. A reason Kubernetes adds later comes through as, say,
"Pending/SomeNewReason": outside the table, recorded, never acted on. "Unknown" (the pod's node
stopped reporting) is left out of the table on purpose: mapping it to RUNNING could advance a
PENDING job, and to FAILED would end a job that may still be training. Kubernetes resolves it
itself: after the node's eviction timeout the pod is deleted or failed, and that is mapped.

Exit codes follow the runner's contract (`sf.contract`): INGEST_EXIT means ingest failed (the
user's code never ran), 128+N that the entrypoint was killed by signal N (reported as -N).

A poll only lists; it deletes nothing. Finished Jobs go when their TTL says (`FINISHED_TTL_S`),
and `cancel` is the only delete.

Trust boundaries (docs/ARCHITECTURE.md, invariant 8). A pod's environment is the image's own plus
exactly `base_env` (HOME is the pod's work dir; PATH stays the image's, which knows where its
interpreter lives) and the launch spec's env: nothing of the server's. Pod specs are readable
by whoever may read pods in the namespace, so the runner gets a one-time bootstrap token
(`BOOTSTRAP_TOKEN`), never the job token or record key. GPU visibility is the platform's: a
0-GPU pod always gets NVIDIA_VISIBLE_DEVICES=void (the NVIDIA runtime would expose every GPU
of the node otherwise) and a job's own GPU visibility variables are dropped. The pod does not
mount a service account token unless the cluster names a `service_account` and sets
`automount_service_account_token: true`.
"""

import dataclasses
import datetime as dt
import fnmatch
import hashlib
import json
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import urllib3
from django.conf import settings as django_settings
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.utils import parse_quantity
from sf.contract import INGEST_EXIT, INGEST_FAILED, entrypoint_code, killed_by, rank_env

from jobs.executors.base import (
    PREEMPT_GRACE,
    TIME_LIMIT_BACKSTOP_S,
    Capacity,
    LaunchError,
    LaunchSpec,
    NodeCapacity,
    Observation,
    base_env,
    gpu_type_matches,
    passed_on,
    preempt_grace_s,
)
from jobs.states import JobStatus

if TYPE_CHECKING:
    from jobs.models import Cluster

log = logging.getLogger(__name__)
S = JobStatus

MANAGED_BY = "app.kubernetes.io/managed-by"
SELECTOR = f"{MANAGED_BY}=starforge"
CONTAINER = "main"
WORK_DIR = "/sf"  # an emptyDir: writable whatever user the image runs as
# Finished Jobs are listed on every poll until Kubernetes deletes them, but one deleted before the
# reconciler saw its end would be failed as lost: a day outlasts any reasonable worker outage.
FINISHED_TTL_S = 24 * 3600
POD_FLUSH_S = 15  # past the runner's own SIGKILL of the job: its last lines and exit record
TIMEOUT = (5, 30)  # connect, read (seconds): an unreachable API fails a tick, never hangs it
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
# Where the Job controller writes an indexed pod's index (its rank); 1.28 adds a label too.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# Never in a pod spec: anyone who may read pods in the namespace reads their env.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
# Pod reasons for a pod that failed because of its node, not its code: retryable as "lost".
NODE_LOST = {"NodeLost", "Shutdown", "NodeShutdown", "Terminated", "ContainerStatusUnknown"}


class KubernetesExecutor:
    # The runner exchanges a one-time SF_BOOTSTRAP_TOKEN for its job token on start.
    BOOTSTRAP_TOKEN: ClassVar[bool] = True
    # Each rank of a multi-node job is a pod with a runner of its own, not one runner
    # supervising them all: each rank exchanges the bootstrap credential once, and only the
    # engine knows when the last rank is up, so such an attempt's start is the poll's.
    RANK_RUNNERS: ClassVar[bool] = True
    # A pod's deletion is its SIGTERM, its terminationGracePeriodSeconds the grace to SIGKILL.
    PREEMPT_BY_TERM: ClassVar[bool] = True
    STATE_TABLE: ClassVar[dict[str, JobStatus]] = {
        "Pending": S.PENDING,  # the Job exists, its pod does not yet, or has no status yet
        "Pending/Suspended": S.PENDING,  # spec.suspend: a queue (Kueue) holds the Job back
        "Pending/Unschedulable": S.PENDING,  # PodScheduled=False: no node fits (GPUs, selector)
        "Pending/SchedulingGated": S.PENDING,  # schedulingGates not yet removed
        "Pending/ContainerCreating": S.PENDING,  # scheduled: volumes, image pull in progress
        "Pending/PodInitializing": S.PENDING,  # init containers running
        "Pending/ImagePullBackOff": S.PENDING,  # the pending deadline ends it if it persists
        "Pending/ErrImagePull": S.PENDING,
        "Pending/InvalidImageName": S.PENDING,
        "Pending/CreateContainerConfigError": S.PENDING,  # a missing secret or config map
        "Pending/CreateContainerError": S.PENDING,
        "Running": S.RUNNING,  # the runner's container is up (ingest, then the entrypoint)
        "Succeeded": S.SUCCEEDED,  # exit 0
        "Failed": S.FAILED,  # the entrypoint exited non-zero
        "Failed/Killed": S.FAILED,  # exit 128+N: the entrypoint was killed by signal N
        "Failed/IngestFailed": S.FAILED,  # exit INGEST_EXIT: snapshot fetch/unpack failed
        "Failed/OOMKilled": S.FAILED,  # the container hit its memory limit
        "Failed/Evicted": S.FAILED,  # the kubelet evicted the pod (node pressure)
        "Failed/Preempted": S.FAILED,  # the scheduler preempted it for a higher priority pod
        "Failed/Disrupted": S.FAILED,  # drained, tainted away, or garbage-collected with its node
        "Failed/NodeLost": S.FAILED,  # its node shut down or vanished mid-run
        "Failed/NotStarted": S.FAILED,  # failed before the container ran (kubelet admission)
        "Failed/DeadlineExceeded": S.FAILED,  # activeDeadlineSeconds passed
        "JobFailed/BackoffLimitExceeded": S.FAILED,  # the Job failed; no pod left to say why
        "JobFailed/PodFailurePolicy": S.FAILED,
    }

    def __init__(self, cluster: "Cluster") -> None:
        self.validate_settings(
            {k: v for k, v in cluster.settings.items() if k not in ("output_root", PREEMPT_GRACE)}
        )
        self.cluster = cluster
        self.settings = {**DEFAULTS, **cluster.settings}
        self.namespace: str = self.settings["namespace"]
        self.gpu_resource: str = self.settings["gpu_resource"]

    # -- interface ---------------------------------------------------------------------------
    @staticmethod
    def validate_settings(settings: dict) -> None:
        """Raise ValueError with one sentence on the first thing wrong with a cluster's settings."""
        unknown = sorted(set(settings) - SETTINGS)
        if unknown:
            raise ValueError(
                f"Unknown Kubernetes setting {unknown[0]!r}; known: {', '.join(sorted(SETTINGS))}."
            )
        _check_connection(settings)
        _check_pod_settings(settings)

    @staticmethod
    def check_request(settings: dict, *, nodes: int, image: str) -> None:
        """Any number of nodes; an image of the job's own only where `allowed_images` allows."""
        if image and not image_allowed(settings, image):
            raise ValueError(image_refusal(settings, image))

    def submit(self, spec: LaunchSpec) -> str:
        name = job_name(spec.name)
        if spec.image and not image_allowed(self.settings, spec.image):
            raise LaunchError(image_refusal(self.settings, spec.image), permanent=True)
        products = self._gpu_products(spec.gpu_type) if spec.gpu_type else []
        with self._api(f"creating Job {name}"):
            job = self._create(
                self._batch().create_namespaced_job,
                client.V1Job,
                self.job_manifest(name, spec, products),
            )
        if spec.nodes > 1:
            with self._api(f"creating Service {name}"):
                # The Service is the Job's: deleting the Job (cancel, its TTL) deletes it too.
                uid = (job or self._read_job(name))["metadata"]["uid"]
                self._create(
                    self._core().create_namespaced_service,
                    client.V1Service,
                    self.service_manifest(name, uid, spec),
                )
        return name

    def _create(self, create: Any, model: Any, manifest: dict) -> dict | None:
        """Create an object; None when one of its name exists (launched before: adopt it)."""
        try:
            return _json(
                create(
                    self.namespace,
                    model.model_validate(manifest),
                    _request_timeout=TIMEOUT,
                    _preload_content=False,
                )
            )
        except ApiException as exc:
            if exc.status != 409:  # 409 AlreadyExists
                raise
            log.info(
                "%s %s already exists: adopting it", manifest["kind"], manifest["metadata"]["name"]
            )
            return None

    def find(self, name: str) -> str | None:
        name = job_name(name)
        with self._api(f"reading Job {name}"):
            try:
                self._read_job(name)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
        return name

    def _read_job(self, name: str) -> dict:
        return _json(
            self._batch().read_namespaced_job(
                name, self.namespace, _request_timeout=TIMEOUT, _preload_content=False
            )
        )

    def poll(self, job_refs: list[str]) -> dict[str, Observation]:
        observed = self._observe_all()
        return {ref: observed[ref] for ref in job_refs if ref in observed}

    def reap_stale(self, observations: dict[str, Observation]) -> list[str]:
        """Nothing to reap: a poll marks nothing, and Kubernetes ends its pods itself."""
        return []

    def starforge_objects(self) -> dict[str, Observation]:
        """Starforge's Jobs in the namespace (its label) that have not ended."""
        return {
            ref: Observation(obs.native_state, name=ref)
            for ref, obs in self._observe_all().items()
            if self.STATE_TABLE.get(obs.native_state) in (S.PENDING, S.RUNNING)
        }

    def _observe_all(self) -> dict[str, Observation]:
        """Every Starforge Job in the namespace, by name: one list of Jobs, one of pods."""
        with self._api("listing Starforge Jobs and pods"):
            jobs = _items(
                self._batch().list_namespaced_job(
                    self.namespace,
                    label_selector=SELECTOR,
                    _request_timeout=TIMEOUT,
                    _preload_content=False,
                )
            )
            pods = _items(
                self._core().list_namespaced_pod(
                    self.namespace,
                    label_selector=SELECTOR,
                    _request_timeout=TIMEOUT,
                    _preload_content=False,
                )
            )
        pods_of = _pods_by_job_uid(pods)
        return {
            job["metadata"]["name"]: observe(job, pods_of.get(job["metadata"].get("uid"), []))
            for job in jobs
        }

    def cancel(self, job_ref: str) -> None:
        with self._api(f"deleting Job {job_ref}"):
            try:
                # Foreground: the Job stays visible until its pods are gone, so the GPUs they
                # still hold while terminating are not mistaken for free.
                _json(
                    self._batch().delete_namespaced_job(
                        job_ref,
                        self.namespace,
                        propagation_policy="Foreground",
                        _request_timeout=TIMEOUT,
                        _preload_content=False,
                    )
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def preempt(self, job_ref: str, grace_s: int) -> None:
        """The Job's deletion: each pod gets SIGTERM and its termination grace period
        (`preempt_grace_s` when it was made) before SIGKILL."""
        self.cancel(job_ref)

    def capacity(self) -> Capacity:
        """Each usable node with the GPUs Starforge may use there and its GPU product label;
        a Job's pods may share a node, as the Kubernetes scheduler places them."""
        try:
            with self._api("listing nodes"):
                usable = [n for n in self._nodes() if self._usable(n)]
                held = self._gpus_held_by_others({n["metadata"]["name"] for n in usable})
        except LaunchError as exc:
            return Capacity(reachable=False, message=str(exc))
        label = self.settings["gpu_label"]
        nodes = tuple(
            NodeCapacity(
                n["metadata"]["name"],
                max(
                    _gpus(n["status"].get("allocatable", {}), self.gpu_resource)
                    - held.get(n["metadata"]["name"], 0),
                    0,
                ),
                (n["metadata"].get("labels") or {}).get(label, ""),
            )
            for n in usable
        )
        return Capacity(
            reachable=True,
            total_gpus=sum(n.gpus for n in nodes),
            nodes=nodes,
            ranks_share_nodes=True,
        )

    def _nodes(self) -> list[dict]:
        """The nodes the cluster's `node_selector` picks (every node without one)."""
        return _items(
            self._core().list_node(
                label_selector=_selector(self.settings.get("node_selector") or {}),
                _request_timeout=TIMEOUT,
                _preload_content=False,
            )
        )

    def _gpu_products(self, gpu_type: str) -> list[str]:
        """The values of the GPU label on the cluster's nodes that `gpu_type` matches, for the
        node affinity of a job asking for that type; none fitting now is worth a retry (the
        scheduler admitted the job on a node of that type: it may come back)."""
        label = self.settings["gpu_label"]
        with self._api("listing nodes"):
            have = {(n["metadata"].get("labels") or {}).get(label, "") for n in self._nodes()}
        products = sorted(v for v in have if v and gpu_type_matches(gpu_type, v))
        if not products:
            raise LaunchError(
                f"no node of cluster {self.cluster.name} has {gpu_type} GPUs now (node label "
                f"{label}: {', '.join(sorted(have - {''})) or 'on no node'})",
                permanent=False,
            )
        return products

    # -- the Job -----------------------------------------------------------------------------
    def _labels(self, spec: LaunchSpec) -> dict[str, str]:
        return {
            MANAGED_BY: "starforge",
            "starforge.io/run-id": label_value(spec.run_id),
            "starforge.io/attempt": str(spec.attempt),
            "starforge.io/team": label_value(spec.team),
            "starforge.io/job-id": str(spec.job_id),
        }

    def job_manifest(self, name: str, spec: LaunchSpec, gpu_products: Sequence[str] = ()) -> dict:
        """The Job of an attempt; `gpu_products`, the GPU label values its nodes may have."""
        labels = self._labels(spec)
        job_spec: dict[str, Any] = {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": FINISHED_TTL_S,
            "template": {
                "metadata": {"labels": labels},
                "spec": self._pod_spec(spec, gpu_products),
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
        deadlines = (
            [int(self.settings["active_deadline_s"])]
            if self.settings.get("active_deadline_s")
            else []
        )
        if spec.time_limit_s:
            # The Job's clock starts before its pod runs: the wait it may have, then the run
            # it may have, then the backstop past the reconciler's own stop at the limit.
            deadlines.append(spec.pending_deadline_s + spec.time_limit_s + TIME_LIMIT_BACKSTOP_S)
        if deadlines:
            job_spec["activeDeadlineSeconds"] = min(deadlines)
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
            "spec": job_spec,
        }

    def service_manifest(self, name: str, job_uid: str, spec: LaunchSpec) -> dict:
        """The headless Service that gives each pod of a multi-node Job its DNS name."""
        labels = self._labels(spec)
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
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
                    k: labels[k]
                    for k in (MANAGED_BY, "starforge.io/run-id", "starforge.io/attempt")
                },
                # A rank resolves rank 0 while both start, before readiness says anything.
                "publishNotReadyAddresses": True,
            },
        }

    def _pod_spec(self, spec: LaunchSpec, gpu_products: Sequence[str] = ()) -> dict:
        env = base_env(WORK_DIR)
        del env["PATH"]  # the image's PATH: it knows where the image's interpreter lives
        env.update(passed_on(spec.env, spec_is_public=self.BOOTSTRAP_TOKEN))
        gpus = spec.gpus_per_node
        if gpus == 0:
            # Without a GPU limit the NVIDIA runtime would expose every GPU of the node.
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        name = job_name(spec.name)
        entries: dict[str, dict[str, Any]] = {k: {"name": k, "value": v} for k, v in env.items()}
        if spec.nodes > 1:  # the platform's rank contract, over a job's own variable of a name
            for k, v in self._rank_env(name, spec).items():
                entries[k] = (
                    {"name": k, "valueFrom": v} if isinstance(v, dict) else {"name": k, "value": v}
                )
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": spec.image or self.settings["image"],
            "command": [self.settings["python"], "-m", "sf.runner"],
            "env": [entries[k] for k in sorted(entries)],
            "workingDir": WORK_DIR,
            "volumeMounts": [{"name": "sf-work", "mountPath": WORK_DIR}],
            # The tail of the runner's output becomes the terminated state's message.
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        resources = _resources(self.gpu_resource, gpus, spec.cpus, spec.memory_mb)
        if resources:
            container["resources"] = resources
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            # The runner kills the job a preemption's grace after SIGTERM (SF_STOP_GRACE_S);
            # the kubelet's SIGKILL comes past that, so the runner can ship its last lines.
            "terminationGracePeriodSeconds": preempt_grace_s(self.cluster.settings) + POD_FLUSH_S,
            "enableServiceLinks": False,
            # No Kubernetes API credential in the pod unless an operator chose a service
            # account made for jobs and asked for its token (validated together).
            "automountServiceAccountToken": bool(
                self.settings.get("automount_service_account_token")
            ),
            "containers": [container],
            "volumes": [{"name": "sf-work", "emptyDir": {}}],
        }
        optional = {
            "nodeSelector": self.settings.get("node_selector"),
            "tolerations": self.settings.get("tolerations"),
            "serviceAccountName": self.settings.get("service_account"),
            "imagePullSecrets": [
                {"name": s} for s in self.settings.get("image_pull_secrets") or []
            ],
        }
        pod.update({k: v for k, v in optional.items() if v})
        if spec.nodes > 1:
            pod["subdomain"] = name  # the headless Service: pod i is <job>-<i>.<job>
        if gpu_products:
            term = {"key": self.settings["gpu_label"], "operator": "In", "values": [*gpu_products]}
            pod["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [term]}]
                    }
                }
            }
        if self.settings.get("output_pvc"):
            # Run outputs and checkpoints outlive the pod: a resumed or retried attempt, and
            # follow-on jobs, find them under the same SF_OUTPUT_DIR.
            root = str(self.settings.get("output_root") or django_settings.SF_OUTPUT_ROOT)
            claim = {"claimName": self.settings["output_pvc"]}
            pod["volumes"].append({"name": "sf-outputs", "persistentVolumeClaim": claim})
            container["volumeMounts"].append({"name": "sf-outputs", "mountPath": root})
        return pod

    def _rank_env(self, name: str, spec: LaunchSpec) -> dict[str, str | dict]:
        """The rank contract of every pod of a multi-node Job: values the same for each rank,
        and for the variables whose value is the rank itself, the pod's completion index."""
        addrs = [f"{name}-{i}.{name}" for i in range(spec.nodes)]
        port = int(self.settings["master_port"])
        first, second = (
            rank_env(rank, spec.nodes, spec.gpus_per_node, addrs, port) for rank in (0, 1)
        )
        index = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
        return {k: index if (v, second[k]) == ("0", "1") else v for k, v in first.items()}

    # -- capacity ----------------------------------------------------------------------------
    def _usable(self, node: dict) -> bool:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node.get("status", {}).get("conditions", [])
        )
        tolerations = self.settings.get("tolerations") or []
        return (
            ready
            and not node.get("spec", {}).get("unschedulable")
            and all(_tolerated(t, tolerations) for t in node.get("spec", {}).get("taints", []))
        )

    def _gpus_held_by_others(self, nodes: set[str]) -> dict[str, int]:
        """GPUs requested by live pods Starforge did not start, by usable node.

        The scheduler already subtracts Starforge's own active jobs. This is one cluster-wide,
        server-side filtered list per capacity check; without RBAC to list pods in every
        namespace it is skipped, and other tenants' GPUs then look free until their pods end.
        """
        try:
            pods = _items(
                self._core().list_pod_for_all_namespaces(
                    label_selector=f"{MANAGED_BY}!=starforge",
                    field_selector="status.phase!=Succeeded,status.phase!=Failed",
                    _request_timeout=TIMEOUT,
                    _preload_content=False,
                )
            )
        except ApiException as exc:
            if exc.status != 403:
                raise
            log.warning(
                "cannot list pods cluster-wide (%s): other tenants' GPUs not counted", exc.reason
            )
            return {}
        held: dict[str, int] = {}
        for pod in pods:
            node = pod.get("spec", {}).get("nodeName")
            if node in nodes:
                for container in pod["spec"].get("containers", []):
                    asks = container.get("resources", {})
                    held[node] = held.get(node, 0) + _gpus(
                        {**asks.get("requests", {}), **asks.get("limits", {})}, self.gpu_resource
                    )
        return held

    # -- the API -----------------------------------------------------------------------------
    def _batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self._client())

    def _core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self._client())

    def _client(self) -> client.ApiClient:
        return api_client(
            self.settings.get("kubeconfig"),
            self.settings.get("context"),
            bool(self.settings.get("in_cluster")),
        )

    @contextmanager
    def _api(self, doing: str) -> Iterator[None]:
        """Turn client errors into LaunchError, saying whether trying again could help."""
        try:
            yield
        except ApiException as exc:
            raise LaunchError(
                f"{doing} on cluster {self.cluster.name}: {api_message(exc)}",
                permanent=not _transient(exc),
            ) from exc
        except ConfigException as exc:
            raise LaunchError(
                f"{doing} on cluster {self.cluster.name}: bad Kubernetes configuration: {exc}",
                permanent=False,  # fixing the worker's kubeconfig helps
            ) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise LaunchError(
                f"{doing} on cluster {self.cluster.name}: cannot reach the Kubernetes API at "
                f"{self._client().configuration.host}: {_unreachable_reason(exc)}",
                permanent=False,
            ) from exc


@lru_cache(maxsize=16)
def api_client(kubeconfig: str | None, context: str | None, in_cluster: bool) -> client.ApiClient:
    """One client (and connection pool) per cluster connection; tokens refresh themselves."""
    configuration = client.Configuration()
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=kubeconfig,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
    except Exception as exc:  # a malformed kubeconfig fails inside the library in many ways
        where = "in-cluster config" if in_cluster else kubeconfig or "the default kubeconfig"
        raise ConfigException(f"cannot load {where}: {exc}") from exc
    return client.ApiClient(configuration)


# -- observing -------------------------------------------------------------------------------
def observe(job: dict, pods: list[dict]) -> Observation:
    """The state of one attempt from its Job and the pods the Job owns."""
    spec = job.get("spec", {})
    if spec.get("completionMode") == "Indexed" and (spec.get("completions") or 1) > 1:
        return observe_ranks(job, pods, spec["completions"])
    failed = _condition(job, "Failed")
    if failed and failed.get("reason") == "DeadlineExceeded":
        return _deadline_exceeded(failed, pods)
    pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), default=None)
    seen = observe_pod(pod) if pod else None
    if seen and seen.native_state.split("/")[0] in ("Succeeded", "Failed"):
        return seen
    if _condition(job, "Complete"):
        status = job.get("status", {})
        return Observation(
            "Succeeded",
            exit_code=0,
            start_time=_ts(status.get("startTime")),
            end_time=_ts(status.get("completionTime")),
        )
    if failed:
        return _job_failed(failed)
    if seen:
        return seen
    if job.get("spec", {}).get("suspend"):
        return Observation("Pending/Suspended", message="Suspended: the Job is suspended")
    return Observation("Pending", message="waiting for the Job's pod to be created")


def _job_failed(failed: dict, details: dict | None = None) -> Observation:
    """A Job that failed by its own condition, no pod saying more."""
    reason = failed.get("reason") or "Failed"
    return Observation(
        f"JobFailed/{reason}",
        failure="exit",
        message=_say(reason, failed.get("message")),
        end_time=_ts(failed.get("lastTransitionTime")),
        details=details or {},
    )


_NEVER = dt.datetime.max.replace(tzinfo=dt.UTC)  # the end of a rank that has none yet


def observe_ranks(job: dict, pods: list[dict], nodes: int) -> Observation:
    """The state of a multi-node attempt from its Indexed Job and the newest pod of each rank.

    The first rank to fail fails the attempt with its own state, code and words; RUNNING
    needs every rank up, and starts with the last of them; until then it is PENDING with the
    words of the first rank still waiting. Every observation carries `details["ranks"]`. The
    start is known only while every rank's pod still says when it started: one the Job
    controller deleted took its start along, and the ledger keeps what RUNNING set.
    """
    ranks: dict[int, dict] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", "")):
        index = _rank_of(pod)
        if index is not None and index < nodes:
            ranks[index] = pod
    seen = {i: observe_pod(pod) for i, pod in ranks.items()}
    failed, complete = _condition(job, "Failed"), _condition(job, "Complete")
    ended = [i for i, o in seen.items() if _phase(o) == "Failed"]
    # Kubernetes times an end to the second: of ranks that ended in the same one, a rank that
    # exited on its own failed first, not one killed as the Job ended.
    first = min(
        ended,
        key=lambda i: (seen[i].end_time or _NEVER, seen[i].native_state == "Failed/Killed", i),
        default=None,
    )
    # A rank failing ends the Job: its other pods go, even before the Job says it failed.
    end = "failed" if failed or first is not None else "complete" if complete else ""
    rows = [_rank_row(i, ranks.get(i), seen.get(i), first, end) for i in range(nodes)]
    starts = [o.start_time for o in seen.values() if o.start_time is not None]
    start = max(starts) if len(starts) == nodes else None
    details: dict[str, Any] = {"ranks": rows}
    if failed and failed.get("reason") == "DeadlineExceeded":
        return dataclasses.replace(
            _deadline_exceeded(failed, pods), start_time=start, details=details
        )
    if first is not None:
        details["failed_rank"] = first
        return dataclasses.replace(seen[first], start_time=start, details=details)
    if complete or (len(seen) == nodes and all(_phase(o) == "Succeeded" for o in seen.values())):
        ends = [o.end_time for o in seen.values() if o.end_time]
        done = _ts(job.get("status", {}).get("completionTime")) or max(ends, default=None)
        return Observation(
            "Succeeded", exit_code=0, start_time=start, end_time=done, details=details
        )
    if failed:  # no pod left to say which rank
        return _job_failed(failed, details)
    silent = next((o for o in seen.values() if o.native_state == "Unknown"), None)
    if silent:
        return dataclasses.replace(silent, details=details)
    if all(row["state"] in ("running", "succeeded") for row in rows):
        return Observation("Running", start_time=start, details=details)
    up = sum(1 for row in rows if row["state"] == "running")
    waiting = next(i for i, row in enumerate(rows) if row["state"] == "pending")
    if waiting in seen:
        state, why = seen[waiting].native_state, seen[waiting].message
    elif job.get("spec", {}).get("suspend"):
        state, why = "Pending/Suspended", "Suspended: the Job is suspended"
    else:
        state, why = "Pending", "waiting for its pod to be created"
    return Observation(
        state,
        message=f"not all nodes started: {up} of {nodes} running; rank {waiting}: {why}",
        details=details,
    )


def _rank_of(pod: dict) -> int | None:
    """A pod's completion index: its rank."""
    meta = pod["metadata"]
    marks = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    raw = marks.get(COMPLETION_INDEX, "")
    return int(raw) if raw.isdigit() else None


def _phase(obs: Observation) -> str:
    return obs.native_state.split("/")[0]


def _rank_row(
    index: int, pod: dict | None, obs: Observation | None, first: int | None, end: str
) -> dict:
    """One rank as the ledger keeps it (`jobs.loops.reconciler.checked_ranks`); `end`, how
    the Job ends ("failed", "complete" or "" while it runs)."""
    node = (pod or {}).get("spec", {}).get("nodeName") or ""
    if obs is None:  # no pod: not made yet, or deleted as the Job ended
        state = {"failed": "killed", "complete": "succeeded"}.get(end, "pending")
        return {"rank": index, "node": node, "state": state, "exit_code": None}
    phase = _phase(obs)
    if phase == "Failed":
        state = "failed" if index == first else "killed"
    elif phase == "Succeeded":
        state = "succeeded"
    elif end == "failed":  # still there, but the Job that failed ends it
        state = "killed"
    else:  # "Unknown" too: a pod on a node that stopped reporting, last seen there
        state = "pending" if phase == "Pending" else "running"
    return {"rank": index, "node": node, "state": state, "exit_code": obs.exit_code}


def observe_pod(pod: dict) -> Observation:
    """The state of one pod of a Starforge Job, from its phase, conditions and container."""
    status = pod.get("status", {})
    phase = status.get("phase", "Pending")
    container = _container_state(pod)
    details = {"pod": pod["metadata"]["name"], "node": pod.get("spec", {}).get("nodeName", "")}
    if phase == "Unknown":
        return Observation(
            "Unknown",
            message=f"{status.get('reason', 'Unknown')}: {status.get('message', '')}".rstrip(": "),
            details=details,
        )
    if phase in ("Failed", "Succeeded") or "terminated" in container:
        return _ended(pod, container.get("terminated") or {}, details)
    if "running" in container:
        return Observation(
            "Running", start_time=_ts(container["running"].get("startedAt")), details=details
        )
    return _pending(pod, container.get("waiting") or {}, details)


def _pending(pod: dict, waiting: dict, details: dict) -> Observation:
    scheduled = _condition(pod, "PodScheduled", status="False")
    if scheduled:
        reason = scheduled.get("reason") or "Unscheduled"
        return Observation(
            f"Pending/{reason}", message=_say(reason, scheduled.get("message")), details=details
        )
    if waiting.get("reason"):
        reason = waiting["reason"]
        return Observation(
            f"Pending/{reason}", message=_say(reason, waiting.get("message")), details=details
        )
    return Observation("Pending", message="the pod is pending", details=details)


def _ended(pod: dict, terminated: dict, details: dict) -> Observation:
    status = pod.get("status", {})
    if status.get("phase") == "Succeeded" or (terminated and terminated.get("exitCode") == 0):
        return _end("Succeeded", terminated, details, exit_code=0)
    disruption = _condition(pod, "DisruptionTarget")
    lost = _lost(status.get("reason", ""), terminated.get("reason", ""), disruption)
    if lost is None and terminated:
        return _exited(terminated, details)
    # The node, not the code, ended the pod; or it failed before its container ever ran
    # (a kubelet admission error such as the device plugin failing to allocate a GPU).
    state, failure, reason = lost or ("Failed/NotStarted", "lost", status.get("reason") or "Failed")
    return _end(
        state,
        terminated,
        details,
        failure=failure,
        message=_say(reason, status.get("message") or (disruption or {}).get("message")),
        end_time=_ts(terminated.get("finishedAt") or (disruption or {}).get("lastTransitionTime")),
    )


def _lost(
    pod_reason: str, container_reason: str, disruption: dict | None
) -> tuple[str, str, str] | None:
    """(state, failure, reason) when the pod's node, not its code, ended it."""
    if pod_reason == "Evicted":
        return "Failed/Evicted", "lost", "Evicted"
    if disruption and disruption.get("reason") == "PreemptionByScheduler":
        return "Failed/Preempted", "preempted", "Preempted"
    if pod_reason in NODE_LOST or container_reason in NODE_LOST:
        return "Failed/NodeLost", "lost", pod_reason or container_reason
    if disruption:
        return "Failed/Disrupted", "lost", disruption.get("reason") or "Disrupted"
    return None


def _exited(terminated: dict, details: dict) -> Observation:
    code = terminated.get("exitCode")
    if terminated.get("reason") == "OOMKilled":
        return _end(
            "Failed/OOMKilled",
            terminated,
            details,
            exit_code=_through_contract(code),
            failure="oom",
            message="OOMKilled: the container exceeded its memory limit",
        )
    if code == INGEST_EXIT:  # the user's code never ran: no exit code of its own
        message = _ingest_message(terminated.get("message", ""))
        return _end("Failed/IngestFailed", terminated, details, failure="ingest", message=message)
    return _end(
        "Failed/Killed" if code and killed_by(code) else "Failed",
        terminated,
        details,
        exit_code=_through_contract(code),
        failure="exit",
        message=_say(terminated.get("reason", "Error"), terminated.get("message")),
    )


def _end(state: str, terminated: dict, details: dict, **fields: Any) -> Observation:
    """An ended attempt, timed by its container's terminated state unless told otherwise."""
    fields.setdefault("end_time", _ts(terminated.get("finishedAt")))
    return Observation(
        state, start_time=_ts(terminated.get("startedAt")), details=details, **fields
    )


def _deadline_exceeded(failed: dict, pods: list[dict]) -> Observation:
    ends = [_container_state(p).get("terminated") or {} for p in pods]
    return Observation(
        "Failed/DeadlineExceeded",
        failure="deadline",
        message=_say("DeadlineExceeded", failed.get("message")),
        start_time=next((_ts(t["startedAt"]) for t in ends if t.get("startedAt")), None),
        end_time=_ts(failed.get("lastTransitionTime")),
    )


def _through_contract(code: int | None) -> int | None:
    """The runner exits 128+N when the entrypoint died of signal N: report -N, as locally."""
    return None if code is None else entrypoint_code(code)


def _ingest_message(tail: str) -> str:
    said = f"{INGEST_FAILED}:"
    for line in reversed(tail.splitlines()):
        if said in line:
            return line[line.index(said) :].strip()
    return f"{said} the runner could not fetch or unpack the snapshot (exit {INGEST_EXIT})"


# -- helpers ---------------------------------------------------------------------------------
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


def _resources(gpu_resource: str, gpus: int, cpus: int | None, memory_mb: int | None) -> dict:
    """A container's resources: GPUs as a limit alone (Kubernetes sets an extended resource's
    request to its limit), CPUs and memory asked for and capped alike."""
    asks = {}
    if cpus:
        asks["cpu"] = str(cpus)
    if memory_mb:
        asks["memory"] = f"{memory_mb}Mi"
    limits = {gpu_resource: str(gpus)} if gpus else {}
    if not (limits or asks):
        return {}
    return {"limits": {**limits, **asks}, **({"requests": asks} if asks else {})}


def label_value(value: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", value)[:63].strip("-_.")


def api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except ValueError:
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return f"{exc.status} {exc.reason}: {message or exc.body or ''}".rstrip(": ")


def _transient(exc: ApiException) -> bool:
    """Overload, outages, expired credentials and exceeded ResourceQuotas pass; the rest stay."""
    status = exc.status or 0
    if status >= 500 or status in (401, 408, 429):
        return True
    return status == 403 and "exceeded quota" in (exc.body or "")


def _unreachable_reason(exc: Exception) -> str:
    """urllib3 nests the cause: keep its last clause ("... [Errno 111] Connection refused")."""
    return str(getattr(exc, "reason", None) or exc).rsplit("): ", 1)[-1]


def _json(response: Any) -> dict:
    """The body of a `_preload_content=False` call: the real API's JSON, not client models."""
    return json.loads(response.data)


def _items(response: Any) -> list[dict]:
    return _json(response).get("items") or []


def _pods_by_job_uid(pods: list[dict]) -> dict[str, list[dict]]:
    owned: dict[str, list[dict]] = {}
    for pod in pods:
        for owner in pod["metadata"].get("ownerReferences") or []:
            if owner.get("kind") == "Job" and owner.get("controller"):
                owned.setdefault(owner.get("uid", ""), []).append(pod)
    return owned


def _container_state(pod: dict) -> dict:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return status.get("state") or {}
    return {}


def _condition(obj: dict, kind: str, status: str = "True") -> dict | None:
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == status:
            return condition
    return None


def _say(reason: str, message: str | None) -> str:
    return f"{reason}: {message.strip()}" if message and message.strip() else reason


def _ts(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


def _selector(labels: dict[str, str]) -> str:
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


# -- settings --------------------------------------------------------------------------------
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


def _is_dns_label(value: object) -> bool:
    return isinstance(value, str) and DNS_LABEL.match(value) is not None


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
