"""The Kubernetes executor: each attempt is one batch/v1 Job whose pods run the job-side runner,
one pod for a single-node job, one per rank for a job on several nodes (`manifests`).

The Job is named from the attempt's deterministic name (a DNS-1123 label), so a second submit
of the same attempt meets 409 AlreadyExists and adopts the first Job: at most one launch per
attempt. Every Job and its pod template carry `app.kubernetes.io/managed-by=starforge` plus the
run id, attempt, team and job id; `backoffLimit: 0` and `restartPolicy: Never` leave retries
to the ledger, where they are counted and metered.

A job's `gpu_type` picks nodes by the node label named by `gpu_label` (GPU feature discovery's
`nvidia.com/gpu.product`, values like NVIDIA-A100-SXM4-80GB). A nodeSelector needs the one
exact value, so submit lists the cluster's nodes and requires, by node affinity `In`, one of
the values there that `gpu_type_matches` accepts ("a100" takes every A100 product). A job's own
image is refused at submit (`check_request`) and again at launch, since `allowed_images` may
have narrowed.

A poll is one labelled list of Jobs and one of Pods in the cluster's namespace, however many
attempts are live, read by `observe`. It only lists; it deletes nothing. Finished Jobs go when
their TTL says (`manifests.FINISHED_TTL_S`), and `cancel` is the only delete.
"""

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from jobs.executors.base import (
    PREEMPT_GRACE,
    Capacity,
    LaunchError,
    LaunchSpec,
    Observation,
    gpu_type_matches,
)
from jobs.executors.kubernetes.manifests import (
    MANAGED_BY,
    SPEC_IS_PUBLIC,
    image_allowed,
    image_refusal,
    job_manifest,
    job_name,
    service_manifest,
)
from jobs.executors.kubernetes.nodes import (
    LIVE_PODS,
    OTHERS_PODS,
    gpu_products,
    gpus_held,
    label_selector,
    node_capacity,
    usable,
)
from jobs.executors.kubernetes.observe import STATE_TABLE, observe, pods_by_job_uid
from jobs.executors.kubernetes.settings import DEFAULTS, check_settings
from jobs.states import JobStatus

if TYPE_CHECKING:
    from jobs.models import Cluster

log = logging.getLogger(__name__)
S = JobStatus

SELECTOR = f"{MANAGED_BY}=starforge"
TIMEOUT = (5, 30)  # connect, read (seconds): an unreachable API fails a tick, never hangs it


class KubernetesExecutor:
    # The runner exchanges a one-time SF_BOOTSTRAP_TOKEN for its job token on start: a pod spec
    # is no place for a secret.
    BOOTSTRAP_TOKEN: ClassVar[bool] = SPEC_IS_PUBLIC
    # Each rank of a multi-node job is a pod with a runner of its own, not one runner
    # supervising them all: each rank exchanges the bootstrap credential once, and only the
    # engine knows when the last rank is up, so such an attempt's start is the poll's.
    RANK_RUNNERS: ClassVar[bool] = True
    # A pod's deletion is its SIGTERM, its terminationGracePeriodSeconds the grace to SIGKILL.
    PREEMPT_BY_TERM: ClassVar[bool] = True
    # Every native state `observe` reports, mapped; kept beside the code that reads them.
    STATE_TABLE: ClassVar[dict[str, JobStatus]] = STATE_TABLE

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
        check_settings(settings)

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
                job_manifest(self.settings, name, spec, products),
            )
        if spec.nodes > 1:
            with self._api(f"creating Service {name}"):
                # The Service is the Job's: deleting the Job (cancel, its TTL) deletes it too.
                uid = (job or self._read_job(name))["metadata"]["uid"]
                self._create(
                    self._core().create_namespaced_service,
                    client.V1Service,
                    service_manifest(self.settings, name, uid, spec),
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
        pods_of = pods_by_job_uid(pods)
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
        tolerations = self.settings.get("tolerations") or []
        try:
            with self._api("listing nodes"):
                found = [n for n in self._nodes() if usable(n, tolerations)]
                held = self._gpus_held_by_others({n["metadata"]["name"] for n in found})
        except LaunchError as exc:
            return Capacity(reachable=False, message=str(exc))
        return node_capacity(found, held, self.settings["gpu_label"], self.gpu_resource)

    def _nodes(self) -> list[dict]:
        """The nodes the cluster's `node_selector` picks (every node without one)."""
        return _items(
            self._core().list_node(
                label_selector=label_selector(self.settings.get("node_selector") or {}),
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
            have = gpu_products(self._nodes(), label)
        products = sorted(v for v in have if v and gpu_type_matches(gpu_type, v))
        if not products:
            raise LaunchError(
                f"no node of cluster {self.cluster.name} has {gpu_type} GPUs now (node label "
                f"{label}: {', '.join(sorted(have - {''})) or 'on no node'})",
                permanent=False,
            )
        return products

    def _gpus_held_by_others(self, nodes: set[str]) -> dict[str, int]:
        """GPUs requested by live pods Starforge did not start, by usable node.

        The scheduler already subtracts Starforge's own active jobs. This is one cluster-wide,
        server-side filtered list per capacity check; without RBAC to list pods in every
        namespace it is skipped, and other tenants' GPUs then look free until their pods end.
        """
        try:
            pods = _items(
                self._core().list_pod_for_all_namespaces(
                    label_selector=OTHERS_PODS,
                    field_selector=LIVE_PODS,
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
        return gpus_held(pods, nodes, self.gpu_resource)

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
