"""FakeKubelet: the Job controller and the kubelet of one node, against the in-process API server.

For every batch/v1 Job in the emulator it creates one pod, as the Job controller does (labels
from the template, `ownerReferences` to the Job, name `<job>-<5 random chars>`), then plays the
kubelet: Pending/ContainerCreating for one beat, then it runs the container's command and args
LOCALLY as a subprocess, with the container's env on top of a bare environment (PATH, HOME,
HOSTNAME) in a fresh temporary directory, so `python -m sf.runner` with the SF_* contract really
runs (point SF_API_URL at a live Starforge, or leave it and SF_SNAPSHOT empty to run offline).
An absolute command[0] (the `python` cluster setting set to sys.executable) has its directory
put first on PATH, as an image's interpreter would be.

The pod goes Running with `running.startedAt`, then Succeeded or Failed with `terminated`
exitCode/reason/startedAt/finishedAt from the real process. Death by signal N reads as exit
128+N, as a container runtime reports it; with FallbackToLogsOnError a failure's message is the
tail of the container's output (kept in `container.log` of its temp dir). The Job gets the
conditions the real controller writes: SuccessCriteriaMet + Complete, or FailureTarget + Failed
with BackoffLimitExceeded (DeadlineExceeded once `activeDeadlineSeconds` has passed, after a
SIGTERM). When a pod disappears (its Job deleted with propagation, or the pod itself deleted)
its process group gets SIGTERM, then SIGKILL after `grace_s`.

Not emulated: image pulls (`image` is ignored), `workingDir` and volumes (the container runs in
its temp dir), resource limits, restarts, replacement pods, more than one node.

    kubelet = FakeKubelet(apiserver, node="node-1", root=tmp_path, tick_s=0.05, grace_s=2.0)
    kubelet.start(); ...; kubelet.close()        # or: with FakeKubelet(apiserver) as kubelet:

Controls (job_name is the Job's name; namespace defaults to "default"), usable before the pod
exists:
    hold(job_name, reason="ImagePullBackOff", message=...)  pod stays Pending, container waiting
    unschedulable(job_name, message=...)     PodScheduled=False, reason Unschedulable, no node
    release(job_name)                        undo hold/unschedulable: the pod goes on to run
    oom_kill(job_name)                       SIGKILL; terminated reason OOMKilled, exit 137
    evict(job_name, message=...)             SIGKILL; phase Failed, reason Evicted
                                             (both act once the container runs)
    unknown(job_name)                        the node goes silent: process killed, phase Unknown
and for assertions: pod(job_name) (the pod object or None), workdir(job_name) (the container's
temp dir: the runner's exit.json, console.log, container.log).
"""

import datetime as dt
import os
import random
import signal
import subprocess
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from tests.engines.kubernetes.apiserver import FakeApiServer, now_rfc3339

POD_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet Kubernetes draws pod suffixes from


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
    proc: subprocess.Popen | None = None
    started_at: str = ""
    creating_shown: bool = False
    logs_on_error: bool = False
    done: bool = False
    term_sent_at: float | None = None
    killed: set[str] = field(default_factory=set)


class FakeKubelet:
    def __init__(
        self,
        api: FakeApiServer,
        *,
        node: str = "node-1",
        root: Path | None = None,
        tick_s: float = 0.05,
        grace_s: float = 2.0,
    ) -> None:
        self.api, self.node, self.tick_s, self.grace_s = api, node, tick_s, grace_s
        self.root = Path(root or os.environ.get("TMPDIR", "/tmp")) / f"kubelet-{node}"
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._controls: dict[tuple[str, str], _Controls] = {}
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
    ) -> None:
        self._control(job_name, namespace).hold = (reason, message)

    def unschedulable(
        self,
        job_name: str,
        message: str = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: "
        "0/1 nodes are available: 1 No preemption victims found for incoming pod.",
        namespace: str = "default",
    ) -> None:
        self._control(job_name, namespace).unschedulable = message

    def release(self, job_name: str, namespace: str = "default") -> None:
        controls = self._control(job_name, namespace)
        controls.hold = controls.unschedulable = None

    def oom_kill(self, job_name: str, namespace: str = "default") -> None:
        self._control(job_name, namespace).fate = "oom"

    def evict(
        self,
        job_name: str,
        message: str = "The node was low on resource: memory. Threshold quantity: 100Mi, "
        "available: 51200Ki.",
        namespace: str = "default",
    ) -> None:
        controls = self._control(job_name, namespace)
        controls.fate, controls.evict_message = "evict", message

    def unknown(self, job_name: str, namespace: str = "default") -> None:
        self._control(job_name, namespace).fate = "unknown"

    def pod(self, job_name: str, namespace: str = "default") -> dict | None:
        with self._lock:
            pod = self._pods.get((namespace, job_name))
        return self.api.get("pods", pod.name, namespace) if pod else None

    def workdir(self, job_name: str, namespace: str = "default") -> Path | None:
        with self._lock:
            pod = self._pods.get((namespace, job_name))
        return pod.workdir if pod else None

    def _control(self, job_name: str, namespace: str) -> _Controls:
        with self._lock:
            return self._controls.setdefault((namespace, job_name), _Controls())

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
        """The Job controller: one pod per Job, created once."""
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        known = self._pods.get(key)
        if (known and known.job_uid == meta["uid"]) or job["spec"].get("suspend"):
            return
        name = f"{meta['name']}-{''.join(random.choices(POD_SUFFIX, k=5))}"
        template = job["spec"]["template"]
        self.api.add(
            "pods",
            {
                "metadata": {
                    "name": name,
                    "labels": dict(template["metadata"]["labels"]),
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
                },
                "spec": dict(template["spec"]),
                "status": {"phase": "Pending", "qosClass": "BestEffort"},
            },
            namespace=key[0],
        )
        self._pods[key] = _Pod(key[0], key[1], meta["uid"], name, self.root / name)
        self._set_job_status(key, {"startTime": now_rfc3339(), "active": 1, "ready": 0})

    def _sync_pod(self, pod: _Pod) -> None:
        """The kubelet: move one pod along, or kill its process when the pod is gone."""
        if pod.done:
            return
        controls = self._controls.get((pod.namespace, pod.job), _Controls())
        if self.api.get("pods", pod.name, pod.namespace) is None:
            self._terminate(pod)
            return
        if controls.fate == "unknown":
            self._go_silent(pod)
        elif controls.unschedulable is not None:
            self._set_pod(pod, _unschedulable(controls.unschedulable))
        elif pod.proc is None:
            self._start(pod, controls)
        else:
            self._watch(pod, controls)

    def _start(self, pod: _Pod, controls: _Controls) -> None:
        if controls.hold is not None or not pod.creating_shown:
            reason, message = controls.hold or ("ContainerCreating", "")
            self._set_pod(pod, self._waiting(pod, reason, message), node=True)
            pod.creating_shown = True
            return
        spec = self.api.get("pods", pod.name, pod.namespace)
        assert spec is not None
        container = spec["spec"]["containers"][0]
        pod.logs_on_error = container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        pod.workdir.mkdir(parents=True, exist_ok=True)
        argv = container.get("command", []) + container.get("args", [])
        path = os.environ.get("PATH", "")
        if argv and os.path.isabs(argv[0]):  # the image's interpreter is on its PATH
            path = os.pathsep.join([os.path.dirname(argv[0]), path])
        env = {"PATH": path, "HOME": str(pod.workdir), "HOSTNAME": pod.name}
        env.update({e["name"]: e.get("value", "") for e in container.get("env", [])})
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
        self._set_pod(pod, self._running(pod), node=True)
        self._set_job_status((pod.namespace, pod.job), {"ready": 1})

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
        terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": pod.started_at,
            "finishedAt": now_rfc3339(),
        }
        if code and pod.logs_on_error:  # terminationMessagePolicy: FallbackToLogsOnError
            terminated["message"] = _tail(pod.workdir / "container.log")
        status = self._status(pod, "Succeeded" if code == 0 else "Failed")
        status["containerStatuses"] = [_container(pod, {"terminated": terminated}, ready=False)]
        if evicted:
            status.update(reason="Evicted", message=evicted)
            status["conditions"].append(
                _cond("DisruptionTarget", "True", "TerminationByKubelet", evicted)
            )
        self._set_pod(pod, status, node=True)
        self._end_job(pod, code == 0, "deadline" in pod.killed)

    def _end_job(self, pod: _Pod, succeeded: bool, deadline: bool) -> None:
        now = now_rfc3339()
        if succeeded:
            conditions = [
                _cond(
                    "SuccessCriteriaMet",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
                _cond(
                    "Complete",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
            ]
            status = {"succeeded": 1, "completionTime": now}
        else:
            reason, message = (
                ("DeadlineExceeded", "Job was active longer than specified deadline")
                if deadline
                else ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
            )
            conditions = [
                _cond("FailureTarget", "True", reason, message),
                _cond("Failed", "True", reason, message),
            ]
            status = {"failed": 1}
        self._set_job_status(
            (pod.namespace, pod.job), {**status, "active": 0, "ready": 0, "conditions": conditions}
        )

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
            message=f"Node {self.node} which was running pod {pod.name} is unresponsive",
        )
        self._set_pod(pod, status, node=True)
        pod.done = True

    def _terminate(self, pod: _Pod) -> None:
        """The pod is gone: SIGTERM its process, SIGKILL it after the grace period."""
        if pod.proc is None or pod.proc.poll() is not None:
            pod.done = True
            return
        if pod.term_sent_at is None:
            _signal(pod.proc, signal.SIGTERM)
            pod.term_sent_at = time.monotonic()
        elif time.monotonic() - pod.term_sent_at > self.grace_s:
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

    def _set_pod(self, pod: _Pod, status: dict, node: bool = False) -> None:
        def change(obj: dict) -> None:
            obj["status"] = status
            if node:
                obj["spec"]["nodeName"] = self.node

        self.api.mutate("pods", pod.name, change, pod.namespace)

    def _set_job_status(self, key: tuple[str, str], fields: dict) -> None:
        self.api.mutate("jobs", key[1], lambda job: job["status"].update(fields), key[0])


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
