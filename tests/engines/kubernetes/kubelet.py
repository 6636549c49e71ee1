"""FakeKubelet: the Job controller, the scheduler and the kubelet of a few nodes, against the
in-process API server.

For every batch/v1 Job in the emulator it creates the pods the Job controller does (labels from
the template, `ownerReferences` to the Job): one for a NonIndexed Job, named `<job>-<5 random
chars>`; for an Indexed Job one per index, named `<job>-<index>-<5 random chars>`, the index in
the `batch.kubernetes.io/job-completion-index` annotation and label, the host name
`<job>-<index>` and JOB_COMPLETION_INDEX in each container's env. As the scheduler does, it
binds each pod to the first of its nodes that fits: the pod's nodeSelector and required node
affinity (In, NotIn, Exists, DoesNotExist) against the Node object's labels, and the extended
resources it asks for (GPUs) against the node's allocatable less what the pods bound there that
have not ended ask for. A node with no Node object in the emulator takes any pod. A pod that
fits nowhere stays Pending (PodScheduled=False, reason Unschedulable, the scheduler's sentence)
until one fits.

Then it plays the kubelet: Pending/ContainerCreating for one beat, then it runs the container's
command and args LOCALLY as a subprocess, with the container's env (its values, and the pod
fields the downward API's fieldRef paths name) on top of a bare environment (PATH, HOME,
HOSTNAME: the pod's host name) in a fresh temporary directory, so `python -m sf.runner` with the
SF_* contract really runs (point SF_API_URL at a live Starforge, or leave it and SF_SNAPSHOT
empty to run offline). An absolute command[0] (the `python` cluster setting set to
sys.executable) has its directory put first on PATH, as an image's interpreter would be.

The pod goes Running with `running.startedAt`, then Succeeded or Failed with `terminated`
exitCode/reason/startedAt/finishedAt from the real process. Death by signal N reads as exit
128+N, as a container runtime reports it; with FallbackToLogsOnError a failure's message is the
tail of the container's output (kept in `container.log` of its temp dir). The Job gets the
conditions the real controller writes: SuccessCriteriaMet + Complete once every completion
succeeded, or FailureTarget + Failed at the first failed pod, with reason DeadlineExceeded once
`activeDeadlineSeconds` has passed (after a SIGTERM), PodFailurePolicy when a FailJob rule of
its podFailurePolicy matches the container's exit code, BackoffLimitExceeded otherwise; then
the controller deletes the Job's other pods. When a pod disappears (its Job deleted with
propagation, the controller ending it, or the pod itself deleted) its process group gets
SIGTERM, then SIGKILL after the pod's `terminationGracePeriodSeconds` (as a kubelet does), or
`grace_s` for a pod that sets none.

Not emulated: image pulls (`image` is ignored), `workingDir` and volumes (the container runs in
its temp dir), CPU and memory, taints, restarts, replacement pods (the first failed pod fails
the Job, as `backoffLimit: 0` does), podFailurePolicy rules on pod conditions, DNS (a pod's
subdomain names nothing on this host).

    kubelet = FakeKubelet(apiserver, node="node-1", root=tmp_path, tick_s=0.05, grace_s=2.0)
    kubelet = FakeKubelet(apiserver, nodes=["gpu-1", "gpu-2"], root=tmp_path)  # several nodes
    kubelet.start(); ...; kubelet.close()        # or: with FakeKubelet(apiserver) as kubelet:

Controls (job_name is the Job's name; namespace defaults to "default"; `index` picks one pod of
an Indexed Job, every pod of the Job without it), usable before the pod exists:
    hold(job_name, reason="ImagePullBackOff", message=...)  pod stays Pending, container waiting
    unschedulable(job_name, message=...)     PodScheduled=False, reason Unschedulable, no node
    release(job_name)                        undo hold/unschedulable: the pod goes on to run
    oom_kill(job_name)                       SIGKILL; terminated reason OOMKilled, exit 137
    evict(job_name, message=...)             SIGKILL; phase Failed, reason Evicted
                                             (both act once the container runs)
    unknown(job_name)                        the node goes silent: process killed, phase Unknown
and for assertions: pod(job_name, index=0) (the pod object or None), pods(job_name) (each
index's newest pod object), workdir(job_name, index=0) (the container's temp dir: the runner's
exit.json, console.log, container.log).
"""

import copy
import datetime as dt
import os
import random
import re
import signal
import subprocess
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.engines.kubernetes.apiserver import FakeApiServer, now_rfc3339

POD_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet Kubernetes draws pod suffixes from
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass
class _Controls:
    hold: tuple[str, str] | None = None
    unschedulable: str | None = None
    fate: str = ""  # "", "oom", "evict" or "unknown"
    evict_message: str = ""


@dataclass
class _Pod:
    namespace: str
    job: str
    job_uid: str
    name: str
    workdir: Path
    index: int  # its completion index; 0 in a NonIndexed Job
    asks: dict[str, int]  # the extended resources (GPUs) it asks for
    node: str = ""  # where the scheduler bound it
    container: str = "main"
    proc: subprocess.Popen | None = None
    started_at: str = ""
    creating_shown: bool = False
    logs_on_error: bool = False
    done: bool = False
    outcome: str = ""  # "Succeeded" or "Failed" once its container ended
    exit_code: int | None = None
    term_sent_at: float | None = None
    killed: set[str] = field(default_factory=set)
    grace_s: float | None = None  # its spec's terminationGracePeriodSeconds, if it has one


class FakeKubelet:
    def __init__(
        self,
        api: FakeApiServer,
        *,
        node: str = "node-1",
        nodes: list[str] | None = None,
        root: Path | None = None,
        tick_s: float = 0.05,
        grace_s: float = 2.0,
    ) -> None:
        self.api, self.tick_s, self.grace_s = api, tick_s, grace_s
        self.nodes = list(nodes or [node])
        self.node = self.nodes[0]
        self.root = Path(root or os.environ.get("TMPDIR", "/tmp")) / f"kubelet-{self.node}"
        self._pods: dict[tuple[str, str], _Pod] = {}  # by (namespace, pod name), in creation order
        self._created: set[str] = set()  # the uids of the Jobs whose pods exist
        self._controls: dict[tuple[str, str, int | None], _Controls] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "FakeKubelet":
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        with self._lock:
            for pod in self._pods.values():
                if pod.proc and pod.proc.poll() is None:
                    _signal(pod.proc, signal.SIGKILL)
                    pod.proc.wait(timeout=10)

    def __enter__(self) -> "FakeKubelet":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- controls ----------------------------------------------------------------------------
    def hold(
        self,
        job_name: str,
        reason: str = "ImagePullBackOff",
        message: str = 'Back-off pulling image "registry.example/train:latest"',
        namespace: str = "default",
        index: int | None = None,
    ) -> None:
        self._control(job_name, namespace, index).hold = (reason, message)

    def unschedulable(
        self,
        job_name: str,
        message: str = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: "
        "0/1 nodes are available: 1 No preemption victims found for incoming pod.",
        namespace: str = "default",
        index: int | None = None,
    ) -> None:
        self._control(job_name, namespace, index).unschedulable = message

    def release(self, job_name: str, namespace: str = "default", index: int | None = None) -> None:
        controls = self._control(job_name, namespace, index)
        controls.hold = controls.unschedulable = None

    def oom_kill(self, job_name: str, namespace: str = "default", index: int | None = None) -> None:
        self._control(job_name, namespace, index).fate = "oom"

    def evict(
        self,
        job_name: str,
        message: str = "The node was low on resource: memory. Threshold quantity: 100Mi, "
        "available: 51200Ki.",
        namespace: str = "default",
        index: int | None = None,
    ) -> None:
        controls = self._control(job_name, namespace, index)
        controls.fate, controls.evict_message = "evict", message

    def unknown(self, job_name: str, namespace: str = "default", index: int | None = None) -> None:
        self._control(job_name, namespace, index).fate = "unknown"

    def pod(self, job_name: str, namespace: str = "default", index: int = 0) -> dict | None:
        pod = self._newest(job_name, namespace, index)
        return self.api.get("pods", pod.name, namespace) if pod else None

    def pods(self, job_name: str, namespace: str = "default") -> dict[int, dict | None]:
        """Each index's newest pod object (None where it is gone), by index."""
        with self._lock:
            indexes = sorted(
                {
                    p.index
                    for p in self._pods.values()
                    if (p.namespace, p.job) == (namespace, job_name)
                }
            )
        return {i: self.pod(job_name, namespace, i) for i in indexes}

    def workdir(self, job_name: str, namespace: str = "default", index: int = 0) -> Path | None:
        pod = self._newest(job_name, namespace, index)
        return pod.workdir if pod else None

    def _newest(self, job_name: str, namespace: str, index: int) -> _Pod | None:
        with self._lock:
            mine = [
                p
                for p in self._pods.values()
                if (p.namespace, p.job, p.index) == (namespace, job_name, index)
            ]
        return mine[-1] if mine else None

    def _control(self, job_name: str, namespace: str, index: int | None) -> _Controls:
        with self._lock:
            return self._controls.setdefault((namespace, job_name, index), _Controls())

    def _controls_of(self, pod: _Pod) -> _Controls:
        """The pod's own controls, else its Job's."""
        key = (pod.namespace, pod.job)
        return (
            self._controls.get((*key, pod.index)) or self._controls.get((*key, None)) or _Controls()
        )

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                with self._lock:
                    for job in self.api.select("jobs"):
                        self._sync_job(job)
                    for pod in list(self._pods.values()):
                        self._sync_pod(pod)
            except Exception:  # a bad tick must not stop the node: say so, go on
                traceback.print_exc()

    def _sync_job(self, job: dict) -> None:
        """The Job controller: a Job's pods, created once (one per index of an Indexed Job)."""
        meta, spec = job["metadata"], job["spec"]
        if meta["uid"] in self._created or spec.get("suspend"):
            return
        self._created.add(meta["uid"])
        indexed = spec.get("completionMode") == "Indexed"
        count = spec.get("completions", 1) if indexed else 1
        for index in range(count):
            self._create_pod(job, index if indexed else None)
        self._set_job_status(
            (meta["namespace"], meta["name"]),
            {"startTime": now_rfc3339(), "active": count, "ready": 0},
        )

    def _create_pod(self, job: dict, index: int | None) -> None:
        meta = job["metadata"]
        template = copy.deepcopy(job["spec"]["template"])
        labels = dict(template["metadata"]["labels"])
        annotations = dict(template["metadata"].get("annotations") or {})
        spec = template["spec"]
        suffix = "".join(random.choices(POD_SUFFIX, k=5))
        name = f"{meta['name']}-{suffix}"
        if index is not None:  # what the controller adds to the pods of an Indexed Job
            name = f"{meta['name']}-{index}-{suffix}"
            annotations[COMPLETION_INDEX] = labels[COMPLETION_INDEX] = str(index)
            spec.setdefault("hostname", f"{meta['name']}-{index}")
            ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
            for container in spec.get("containers", []):
                container.setdefault("env", []).append(
                    {"name": "JOB_COMPLETION_INDEX", "valueFrom": ref}
                )
        pod_meta = {
            "name": name,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if annotations:
            pod_meta["annotations"] = annotations
        namespace = meta["namespace"]
        self.api.add(
            "pods",
            {
                "metadata": pod_meta,
                "spec": spec,
                "status": {"phase": "Pending", "qosClass": "BestEffort"},
            },
            namespace=namespace,
        )
        self._pods[(namespace, name)] = _Pod(
            namespace,
            meta["name"],
            meta["uid"],
            name,
            self.root / name,
            index or 0,
            _asks(spec),
            grace_s=spec.get("terminationGracePeriodSeconds"),
        )

    def _sync_pod(self, pod: _Pod) -> None:
        """The kubelet: move one pod along, or kill its process when the pod is gone."""
        if pod.done:
            return
        controls = self._controls_of(pod)
        obj = self.api.get("pods", pod.name, pod.namespace)
        if obj is None:
            self._terminate(pod)
            return
        if controls.fate == "unknown":
            self._go_silent(pod)
        elif controls.unschedulable is not None:
            self._set_pod(pod, _unschedulable(controls.unschedulable))
        elif pod.proc is None:
            self._start(pod, obj, controls)
        else:
            self._watch(pod, controls)

    def _start(self, pod: _Pod, obj: dict, controls: _Controls) -> None:
        if not pod.node:
            node, why = self._schedule(obj["spec"])
            if node is None:
                self._set_pod(pod, _unschedulable(why))
                return
            pod.node = node
        if controls.hold is not None or not pod.creating_shown:
            reason, message = controls.hold or ("ContainerCreating", "")
            self._set_pod(pod, self._waiting(pod, reason, message))
            pod.creating_shown = True
            return
        spec = self.api.get("pods", pod.name, pod.namespace)
        assert spec is not None
        container = spec["spec"]["containers"][0]
        pod.container = container["name"]
        pod.logs_on_error = container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        pod.workdir.mkdir(parents=True, exist_ok=True)
        argv = container.get("command", []) + container.get("args", [])
        path = os.environ.get("PATH", "")
        if argv and os.path.isabs(argv[0]):  # the image's interpreter is on its PATH
            path = os.pathsep.join([os.path.dirname(argv[0]), path])
        host = spec["spec"].get("hostname") or pod.name
        env = {"PATH": path, "HOME": str(pod.workdir), "HOSTNAME": host}
        env.update({e["name"]: _env_value(spec, e) for e in container.get("env", [])})
        pod.started_at = now_rfc3339()
        try:
            with open(pod.workdir / "container.log", "ab") as log:
                pod.proc = subprocess.Popen(
                    argv,
                    cwd=pod.workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            (pod.workdir / "container.log").write_text(f"exec failed: {exc}\n")
            self._finish(pod, 128, "StartError")
            return
        self._set_pod(pod, self._running(pod))
        self._count(pod)

    def _schedule(self, spec: dict) -> tuple[str | None, str]:
        """The scheduler: the first of this kubelet's nodes the pod fits on, or why none."""
        objects = {n["metadata"]["name"]: n for n in self.api.select("nodes")}
        asks = _asks(spec)
        misfits, short = 0, Counter()
        for name in self.nodes:
            node = objects.get(name)
            if node is None:  # no Node object to say what it has: it takes any pod
                return name, ""
            if not _fits(spec, node["metadata"].get("labels") or {}):
                misfits += 1
                continue
            free = self._free(name, node)
            lacking = [r for r, n in asks.items() if free.get(r, 0) < n]
            if not lacking:
                return name, ""
            short.update(lacking)
        reasons = [f"{n} Insufficient {r}" for r, n in sorted(short.items())]
        if misfits:
            reasons.append(f"{misfits} node(s) didn't match Pod's node affinity/selector")
        total = len(self.nodes)
        return None, (
            f"0/{total} nodes are available: {', '.join(reasons)}. preemption: 0/{total} nodes "
            f"are available: {total} Preemption is not helpful for scheduling."
        )

    def _free(self, name: str, node: dict) -> dict[str, int]:
        """A node's extended resources less what the pods bound there that have not ended ask."""
        allocatable = node.get("status", {}).get("allocatable", {})
        free = {r: int(v) for r, v in allocatable.items() if "/" in r}
        for pod in self._pods.values():
            if pod.node == name and not pod.done:
                for resource, count in pod.asks.items():
                    free[resource] = free.get(resource, 0) - count
        return free

    def _watch(self, pod: _Pod, controls: _Controls) -> None:
        assert pod.proc is not None
        if controls.fate in ("oom", "evict") and controls.fate not in pod.killed:
            _signal(pod.proc, signal.SIGKILL)
            pod.killed.add(controls.fate)
        if self._deadline_passed(pod) and "deadline" not in pod.killed:
            _signal(pod.proc, signal.SIGTERM)
            pod.killed.add("deadline")
        code = pod.proc.poll()
        if code is None:
            return
        code = 128 - code if code < 0 else code
        if controls.fate == "oom":
            self._finish(pod, 137, "OOMKilled")
        elif controls.fate == "evict":
            self._finish(pod, code, "Error", evicted=controls.evict_message)
        else:
            self._finish(pod, code, "Completed" if code == 0 else "Error")

    def _finish(self, pod: _Pod, code: int, reason: str, evicted: str = "") -> None:
        pod.done = True
        pod.outcome, pod.exit_code = ("Succeeded" if code == 0 else "Failed"), code
        terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": pod.started_at,
            "finishedAt": now_rfc3339(),
        }
        if code and pod.logs_on_error:  # terminationMessagePolicy: FallbackToLogsOnError
            terminated["message"] = _tail(pod.workdir / "container.log")
        status = self._status(pod, pod.outcome)
        status["containerStatuses"] = [_container(pod, {"terminated": terminated}, ready=False)]
        if evicted:
            status.update(reason="Evicted", message=evicted)
            status["conditions"].append(
                _cond("DisruptionTarget", "True", "TerminationByKubelet", evicted)
            )
        self._set_pod(pod, status)
        self._settle(pod)

    def _count(self, pod: _Pod) -> None:
        """The Job controller's counts of a Job's pods while none has ended it."""
        mine = [p for p in self._pods.values() if p.job_uid == pod.job_uid]
        self._set_job_status(
            (pod.namespace, pod.job),
            {
                "active": sum(not p.done for p in mine),
                "ready": sum(bool(p.started_at) and not p.done for p in mine),
                **_nonzero(
                    succeeded=sum(p.outcome == "Succeeded" for p in mine),
                    failed=sum(p.outcome == "Failed" for p in mine),
                ),
            },
        )

    def _settle(self, pod: _Pod) -> None:
        """The Job controller when one of a Job's pods ended: the Job's end once it has one (its
        first failed pod, or every completion succeeded), else its counts."""
        job = self.api.get("jobs", pod.job, pod.namespace)
        if job is None or job["metadata"]["uid"] != pod.job_uid or _ended(job):
            return
        mine = [p for p in self._pods.values() if p.job_uid == pod.job_uid]
        succeeded = sum(p.outcome == "Succeeded" for p in mine)
        failed = sum(p.outcome == "Failed" for p in mine)
        ended = {"active": 0, "ready": 0, **_nonzero(succeeded=succeeded, failed=failed)}
        if pod.outcome == "Failed":
            reason, message = self._failure(job, pod)
            conditions = [
                _cond("FailureTarget", "True", reason, message),
                _cond("Failed", "True", reason, message),
            ]
            self._set_job_status((pod.namespace, pod.job), {**ended, "conditions": conditions})
            for other in mine:  # a failed Job's other pods are deleted
                if not other.done:
                    self.api.remove("pods", other.name, other.namespace)
        elif succeeded >= job["spec"].get("completions", 1):
            said = "Reached expected number of succeeded pods"
            conditions = [
                _cond("SuccessCriteriaMet", "True", "CompletionsReached", said),
                _cond("Complete", "True", "CompletionsReached", said),
            ]
            self._set_job_status(
                (pod.namespace, pod.job),
                {**ended, "completionTime": now_rfc3339(), "conditions": conditions},
            )
        else:
            self._count(pod)

    def _failure(self, job: dict, pod: _Pod) -> tuple[str, str]:
        """Why a failed pod failed its Job: the reason and message of its Failed condition."""
        if "deadline" in pod.killed:
            return "DeadlineExceeded", "Job was active longer than specified deadline"
        for i, rule in enumerate((job["spec"].get("podFailurePolicy") or {}).get("rules") or []):
            codes = rule.get("onExitCodes")
            if codes is None or codes.get("containerName") not in (None, pod.container):
                continue
            if (pod.exit_code in codes.get("values", [])) == (codes.get("operator") == "In"):
                if rule.get("action") != "FailJob":
                    break  # the first matching rule decides: counted against backoffLimit
                return "PodFailurePolicy", (
                    f"Container {pod.container} for pod {pod.namespace}/{pod.name} failed with "
                    f"exit code {pod.exit_code} matching FailJob rule at index {i}"
                )
        return "BackoffLimitExceeded", "Job has reached the specified backoff limit"

    def _deadline_passed(self, pod: _Pod) -> bool:
        job = self.api.get("jobs", pod.job, pod.namespace) or {}
        limit = job.get("spec", {}).get("activeDeadlineSeconds")
        start = job.get("status", {}).get("startTime")
        if not (limit and start):
            return False
        return (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(start)).total_seconds() > limit

    def _go_silent(self, pod: _Pod) -> None:
        if pod.proc and pod.proc.poll() is None:
            _signal(pod.proc, signal.SIGKILL)
        status = self._status(pod, "Unknown")
        status.update(
            reason="NodeLost",
            message=f"Node {pod.node or self.node} which was running pod {pod.name} is "
            "unresponsive",
        )
        self._set_pod(pod, status)
        pod.done = True

    def _terminate(self, pod: _Pod) -> None:
        """The pod is gone: SIGTERM its process, SIGKILL it after the grace period."""
        if pod.proc is None or pod.proc.poll() is not None:
            pod.done = True
            return
        if pod.term_sent_at is None:
            _signal(pod.proc, signal.SIGTERM)
            pod.term_sent_at = time.monotonic()
        elif time.monotonic() - pod.term_sent_at > (
            self.grace_s if pod.grace_s is None else pod.grace_s
        ):
            _signal(pod.proc, signal.SIGKILL)

    # -- pod status shapes -------------------------------------------------------------------
    def _status(self, pod: _Pod, phase: str) -> dict:
        return {
            "phase": phase,
            "conditions": [
                _cond("PodScheduled", "True"),
                _cond("Ready", "True" if phase == "Running" else "False"),
            ],
            "hostIP": "10.0.0.10",
            "podIP": "10.244.0.17",
            "startTime": pod.started_at or now_rfc3339(),
            "qosClass": "BestEffort",
        }

    def _waiting(self, pod: _Pod, reason: str, message: str) -> dict:
        status = self._status(pod, "Pending")
        waiting = {"reason": reason, **({"message": message} if message else {})}
        status["containerStatuses"] = [_container(pod, {"waiting": waiting}, ready=False)]
        return status

    def _running(self, pod: _Pod) -> dict:
        status = self._status(pod, "Running")
        running = {"running": {"startedAt": pod.started_at}}
        status["containerStatuses"] = [_container(pod, running, ready=True)]
        return status

    def _set_pod(self, pod: _Pod, status: dict) -> None:
        def change(obj: dict) -> None:
            obj["status"] = status
            if pod.node:  # bound: the scheduler wrote its node
                obj["spec"]["nodeName"] = pod.node

        self.api.mutate("pods", pod.name, change, pod.namespace)

    def _set_job_status(self, key: tuple[str, str], fields: dict) -> None:
        self.api.mutate("jobs", key[1], lambda job: job["status"].update(fields), key[0])


def _asks(spec: dict) -> dict[str, int]:
    """The extended resources (`vendor/name`, such as GPUs) a pod's containers ask for."""
    asks: Counter = Counter()
    for container in spec.get("containers", []):
        resources = container.get("resources") or {}
        wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        asks.update({r: int(v) for r, v in wanted.items() if "/" in r})
    return dict(asks)


def _fits(spec: dict, labels: dict) -> bool:
    """Whether a node with these labels satisfies the pod's nodeSelector and required affinity."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(
        all(_holds(e, labels) for e in term.get("matchExpressions") or []) for term in terms
    )


def _holds(expression: dict, labels: dict) -> bool:
    key, values = expression["key"], expression.get("values") or []
    return {
        "In": labels.get(key) in values,
        "NotIn": labels.get(key) not in values,
        "Exists": key in labels,
        "DoesNotExist": key not in labels,
    }.get(expression["operator"], False)


def _env_value(pod: dict, env: dict) -> str:
    """A container env entry's value: its own, or the pod field its fieldRef names."""
    path = ((env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    if path is None:
        return env.get("value", "")
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if keyed:
        return (pod["metadata"].get(keyed[1]) or {}).get(keyed[2], "")
    found: object = pod
    for step in path.split("."):
        found = found.get(step) if isinstance(found, dict) else None
    return "" if found is None else str(found)


def _ended(job: dict) -> bool:
    return any(
        c["type"] in ("Complete", "Failed") and c["status"] == "True"
        for c in job.get("status", {}).get("conditions") or []
    )


def _nonzero(**counts: int) -> dict[str, int]:
    """A Job's status leaves out the counts that are zero."""
    return {k: v for k, v in counts.items() if v}


def _unschedulable(message: str) -> dict:
    return {
        "phase": "Pending",
        "conditions": [_cond("PodScheduled", "False", "Unschedulable", message)],
        "qosClass": "BestEffort",
    }


def _container(pod: _Pod, state: dict, ready: bool) -> dict:
    status = {
        "name": "main",
        "image": "registry.example/train:latest",
        "imageID": "",
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }
    if pod.proc is not None:
        status["containerID"] = f"containerd://{pod.proc.pid:064x}"
    return status


def _cond(kind: str, status: str, reason: str = "", message: str = "") -> dict:
    condition = {"type": kind, "status": status, "lastTransitionTime": now_rfc3339()}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _tail(log: Path, lines: int = 80, limit: int = 2048) -> str:
    """What the kubelet keeps of a failed container's log: its last 80 lines, at most 2 KiB."""
    try:
        text = log.read_bytes()[-limit:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """SIGTERM goes to the container's first process (the runner forwards it); SIGKILL, like a
    runtime killing the container's cgroup, to every process the runner started too (the
    entrypoint runs in its own session)."""
    pids = [proc.pid] + (_descendants(proc.pid) if sig == signal.SIGKILL else [])
    for pid in pids:
        kill = os.killpg if pid == proc.pid else os.kill
        try:
            kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
