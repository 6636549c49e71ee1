"""An attempt's state as Kubernetes shows it: `observe` reads one Job and the pods it owns into
an `Observation`, and `STATE_TABLE` maps every native state read here to a `JobStatus`.

Native states are `Phase[/Reason]` strings read from the Job's conditions, the pod's phase,
reason and conditions, and the `main` container's state; `STATE_TABLE` lists every one this
module reports on purpose. A reason Kubernetes adds later comes through as, say,
"Pending/SomeNewReason": outside the table, recorded, never acted on. "Unknown" (the pod's node
stopped reporting) is left out of the table on purpose: mapping it to RUNNING could advance a
PENDING job, and to FAILED would end a job that may still be training. Kubernetes resolves it
itself: after the node's eviction timeout the pod is deleted or failed, and that is mapped.

A multi-node attempt is RUNNING only once every rank runs, from the last rank's start; while
some ranks run and others wait it stays PENDING, saying "not all nodes started: k of N running",
so the pending deadline ends a gang that never fully starts. The reconciler learns each rank's
state from `details["ranks"]` and which failed first from `details["failed_rank"]`.

The engine's own record of an attempt (`Observation.engine_start`/`engine_end`, which bound the
bill) is its pods' container run: a pod's `startedAt` and `finishedAt`, whole seconds as
Kubernetes keeps them. Of a gang, the earliest start of its ranks and, once none of its pods
runs any more, the latest finish: the span in which any of its pods held GPUs. Its bill still
starts when the last rank is up (`engine_start_bills` False). A pod the Job controller deleted
took its times along: the span is that of the pods still there.

Exit codes follow the runner's contract (`sf.contract`): INGEST_EXIT means ingest failed (the
user's code never ran), 128+N that the entrypoint was killed by signal N (reported as -N).
"""

import dataclasses
import datetime as dt
from typing import Any

from sf.contract import INGEST_EXIT, INGEST_FAILED, Failure, entrypoint_code, killed_by

from jobs.executors.base import Observation
from jobs.executors.kubernetes.manifests import COMPLETION_INDEX, CONTAINER
from jobs.states import JobStatus

S = JobStatus

STATE_TABLE: dict[str, JobStatus] = {
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
# Pod reasons for a pod that failed because of its node, not its code: retryable as "lost".
NODE_LOST = {"NodeLost", "Shutdown", "NodeShutdown", "Terminated", "ContainerStatusUnknown"}


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
        failure=Failure.EXIT,
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
    controller deleted took its start along, and the ledger keeps what RUNNING set. The
    engine's times are its pods' span (the module's docstring).
    """
    ranks: dict[int, dict] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", "")):
        index = _rank_of(pod)
        if index is not None and index < nodes:
            ranks[index] = pod
    seen = {i: observe_pod(pod) for i, pod in ranks.items()}
    start, end = _container_span(list(seen.values()))
    return dataclasses.replace(
        _ranks_state(job, ranks, seen, nodes),
        engine_start=start,
        engine_end=end,
        engine_start_bills=False,  # billed from the last rank's start (module docstring)
    )


def _ranks_state(
    job: dict, ranks: dict[int, dict], seen: dict[int, Observation], nodes: int
) -> Observation:
    """`observe_ranks` but for the engine's times."""
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
            _deadline_exceeded(failed, list(ranks.values())), start_time=start, details=details
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
    return _gang_pending(job, seen, details)


def _gang_pending(job: dict, seen: dict[int, Observation], details: dict[str, Any]) -> Observation:
    """A gang some of whose ranks wait: PENDING, in the words of the first rank waiting."""
    rows = details["ranks"]
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
        message=f"not all nodes started: {up} of {len(rows)} running; rank {waiting}: {why}",
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
        started = _ts(container["running"].get("startedAt"))
        return Observation("Running", start_time=started, details=details, engine_start=started)
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
    not_started = ("Failed/NotStarted", Failure.LOST, status.get("reason") or "Failed")
    state, failure, reason = lost or not_started
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
) -> tuple[str, Failure, str] | None:
    """(state, failure, reason) when the pod's node, not its code, ended it."""
    if pod_reason == "Evicted":
        return "Failed/Evicted", Failure.LOST, "Evicted"
    if disruption and disruption.get("reason") == "PreemptionByScheduler":
        return "Failed/Preempted", Failure.PREEMPTED, "Preempted"
    if pod_reason in NODE_LOST or container_reason in NODE_LOST:
        return "Failed/NodeLost", Failure.LOST, pod_reason or container_reason
    if disruption:
        return "Failed/Disrupted", Failure.LOST, disruption.get("reason") or "Disrupted"
    return None


def _exited(terminated: dict, details: dict) -> Observation:
    code = terminated.get("exitCode")
    if terminated.get("reason") == "OOMKilled":
        return _end(
            "Failed/OOMKilled",
            terminated,
            details,
            exit_code=_through_contract(code),
            failure=Failure.OOM,
            message="OOMKilled: the container exceeded its memory limit",
        )
    if code == INGEST_EXIT:  # the user's code never ran: no exit code of its own
        message = _ingest_message(terminated.get("message", ""))
        return _end(
            "Failed/IngestFailed", terminated, details, failure=Failure.INGEST, message=message
        )
    return _end(
        "Failed/Killed" if code and killed_by(code) else "Failed",
        terminated,
        details,
        exit_code=_through_contract(code),
        failure=Failure.EXIT,
        message=_say(terminated.get("reason", "Error"), terminated.get("message")),
    )


def _end(state: str, terminated: dict, details: dict, **fields: Any) -> Observation:
    """An ended attempt, timed by its container's terminated state unless told otherwise;
    the container's run is the engine's record of it, whatever else ended the pod."""
    started, finished = _ts(terminated.get("startedAt")), _ts(terminated.get("finishedAt"))
    fields.setdefault("end_time", finished)
    return Observation(
        state,
        start_time=started,
        details=details,
        engine_start=started,
        engine_end=finished,
        **fields,
    )


def _deadline_exceeded(failed: dict, pods: list[dict]) -> Observation:
    ends = [_container_state(p).get("terminated") or {} for p in pods]
    engine_start, engine_end = _container_span([observe_pod(pod) for pod in pods])
    return Observation(
        "Failed/DeadlineExceeded",
        failure=Failure.DEADLINE,
        message=_say("DeadlineExceeded", failed.get("message")),
        start_time=next((_ts(t["startedAt"]) for t in ends if t.get("startedAt")), None),
        end_time=_ts(failed.get("lastTransitionTime")),
        engine_start=engine_start,
        engine_end=engine_end,
    )


def _container_span(seen: list[Observation]) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The engine's record of these pods together: their containers' earliest start, and,
    once every one of them has ended, their latest finish (None: not known yet)."""
    start = min((o.engine_start for o in seen if o.engine_start is not None), default=None)
    if not seen or any(_phase(o) not in ("Succeeded", "Failed") for o in seen):
        return start, None
    return start, max((o.engine_end for o in seen if o.engine_end is not None), default=None)


def _through_contract(code: int | None) -> int | None:
    """The runner exits 128+N when the entrypoint died of signal N: report -N, as locally."""
    return None if code is None else entrypoint_code(code)


def _ingest_message(tail: str) -> str:
    said = f"{INGEST_FAILED}:"
    for line in reversed(tail.splitlines()):
        if said in line:
            return line[line.index(said) :].strip()
    return f"{said} the runner could not fetch or unpack the snapshot (exit {INGEST_EXIT})"


def pods_by_job_uid(pods: list[dict]) -> dict[str, list[dict]]:
    """Pods by the uid of the Job that controls them."""
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
