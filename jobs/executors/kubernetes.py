"""Kubernetes executor: each attempt is one batch/v1 Job whose single pod runs the job-side runner.

The Job is named from the attempt's deterministic name (a DNS-1123 label), so a second submit
of the same attempt meets 409 AlreadyExists and adopts the first Job: at most one launch per
attempt. Every Job and its pod template carry `app.kubernetes.io/managed-by=starforge` plus the
run id, attempt, team and job id; `backoffLimit: 0` and `restartPolicy: Never` leave retries
to the ledger, where they are counted and metered.

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

import datetime as dt
import hashlib
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import urllib3
from django.conf import settings as django_settings
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.utils import parse_quantity
from sf.contract import INGEST_EXIT, INGEST_FAILED, entrypoint_code, killed_by

from jobs.executors.base import (
    Capacity,
    LaunchError,
    LaunchSpec,
    Observation,
    base_env,
    passed_on,
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
TIMEOUT = (5, 30)  # connect, read (seconds): an unreachable API fails a tick, never hangs it
DEFAULTS = {"namespace": "default", "gpu_resource": "nvidia.com/gpu", "python": "python"}
SETTINGS = {
    "context",
    "in_cluster",
    "kubeconfig",
    "namespace",
    "image",
    "gpu_resource",
    "node_selector",
    "tolerations",
    "python",
    "api_url",
    "active_deadline_s",
    "service_account",
    "image_pull_secrets",
    "output_pvc",
    "automount_service_account_token",
}
# Never in a pod spec: anyone who may read pods in the namespace reads their env.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
# Pod reasons for a pod that failed because of its node, not its code: retryable as "lost".
NODE_LOST = {"NodeLost", "Shutdown", "NodeShutdown", "Terminated", "ContainerStatusUnknown"}


class KubernetesExecutor:
    # The runner exchanges a one-time SF_BOOTSTRAP_TOKEN for its job token on start.
    BOOTSTRAP_TOKEN: ClassVar[bool] = True
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
        self.validate_settings({k: v for k, v in cluster.settings.items() if k != "output_root"})
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

    def submit(self, spec: LaunchSpec) -> str:
        name = job_name(spec.name)
        with self._api(f"creating Job {name}"):
            try:
                job = client.V1Job.model_validate(self.job_manifest(name, spec))
                self._batch().create_namespaced_job(
                    self.namespace, job, _request_timeout=TIMEOUT, _preload_content=False
                )
            except ApiException as exc:
                if exc.status != 409:  # 409 AlreadyExists: launched before, adopt it
                    raise
                log.info("Job %s already exists: adopting it", name)
        return name

    def find(self, name: str) -> str | None:
        name = job_name(name)
        with self._api(f"reading Job {name}"):
            try:
                _json(
                    self._batch().read_namespaced_job(
                        name, self.namespace, _request_timeout=TIMEOUT, _preload_content=False
                    )
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
        return name

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

    def capacity(self) -> Capacity:
        try:
            with self._api("listing nodes"):
                nodes = _items(
                    self._core().list_node(
                        label_selector=_selector(self.settings.get("node_selector") or {}),
                        _request_timeout=TIMEOUT,
                        _preload_content=False,
                    )
                )
                usable = {n["metadata"]["name"]: n for n in nodes if self._usable(n)}
                total = sum(
                    _gpus(n["status"].get("allocatable", {}), self.gpu_resource)
                    for n in usable.values()
                )
                held = self._gpus_held_by_others(set(usable))
        except LaunchError as exc:
            return Capacity(reachable=False, message=str(exc))
        return Capacity(reachable=True, total_gpus=max(total - held, 0))

    # -- the Job -----------------------------------------------------------------------------
    def job_manifest(self, name: str, spec: LaunchSpec) -> dict:
        labels = {
            MANAGED_BY: "starforge",
            "starforge.io/run-id": label_value(spec.run_id),
            "starforge.io/attempt": str(spec.attempt),
            "starforge.io/team": label_value(spec.team),
            "starforge.io/job-id": str(spec.job_id),
        }
        job_spec: dict[str, Any] = {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": FINISHED_TTL_S,
            "template": {"metadata": {"labels": labels}, "spec": self._pod_spec(spec)},
        }
        if self.settings.get("active_deadline_s"):
            job_spec["activeDeadlineSeconds"] = int(self.settings["active_deadline_s"])
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
            "spec": job_spec,
        }

    def _pod_spec(self, spec: LaunchSpec) -> dict:
        env = base_env(WORK_DIR)
        del env["PATH"]  # the image's PATH: it knows where the image's interpreter lives
        env.update(passed_on(spec.env, spec_is_public=self.BOOTSTRAP_TOKEN))
        if spec.gpus == 0:
            # Without a GPU limit the NVIDIA runtime would expose every GPU of the node.
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": self.settings["image"],
            "command": [self.settings["python"], "-m", "sf.runner"],
            "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
            "workingDir": WORK_DIR,
            "volumeMounts": [{"name": "sf-work", "mountPath": WORK_DIR}],
            # The tail of the runner's output becomes the terminated state's message.
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        if spec.gpus:
            container["resources"] = {"limits": {self.gpu_resource: str(spec.gpus)}}
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
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
        if self.settings.get("output_pvc"):
            # Run outputs and checkpoints outlive the pod: a resumed or retried attempt, and
            # follow-on jobs, find them under the same SF_OUTPUT_DIR.
            root = str(self.settings.get("output_root") or django_settings.SF_OUTPUT_ROOT)
            claim = {"claimName": self.settings["output_pvc"]}
            pod["volumes"].append({"name": "sf-outputs", "persistentVolumeClaim": claim})
            container["volumeMounts"].append({"name": "sf-outputs", "mountPath": root})
        return pod

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

    def _gpus_held_by_others(self, nodes: set[str]) -> int:
        """GPUs requested by live pods Starforge did not start, on the usable nodes.

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
            return 0
        held = 0
        for pod in pods:
            if pod.get("spec", {}).get("nodeName") in nodes:
                for container in pod["spec"].get("containers", []):
                    asks = container.get("resources", {})
                    held += _gpus(
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
        reason = failed.get("reason") or "Failed"
        return Observation(
            f"JobFailed/{reason}",
            failure="exit",
            message=_say(reason, failed.get("message")),
            end_time=_ts(failed.get("lastTransitionTime")),
        )
    if seen:
        return seen
    if job.get("spec", {}).get("suspend"):
        return Observation("Pending/Suspended", message="Suspended: the Job is suspended")
    return Observation("Pending", message="waiting for the Job's pod to be created")


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
