"""Ray executor: each attempt is one Ray job, submitted and watched over the Ray Jobs REST API.

The server never imports `ray` (heavy, with pins of its own): it speaks HTTP to the cluster's
dashboard with the standard library, on the routes that `ray.job_submission.JobSubmissionClient`
wraps (ray/dashboard/modules/job/job_head.py: POST /api/jobs/, GET /api/jobs/,
GET /api/jobs/{id}, POST /api/jobs/{id}/stop). The Ray job's submission id is the attempt's
deterministic name, and Ray refuses a second job under an id it knows: that makes the launch
at-most-once (a repeated submit adopts the job instead of starting another). Nothing here ever
deletes a Ray job, since that would free its id for a second launch.

The job's entrypoint is the job-side runner, started in a per-attempt directory on a Ray node
with the attempt's GPUs reserved for it (`entrypoint_num_gpus`; Ray sets CUDA_VISIBLE_DEVICES).
The runner's exit code comes back as the job's `driver_exit_code`.

Trust boundaries (docs/ARCHITECTURE.md, invariant 8). The submission carries no secret: Ray shows
every job's runtime_env and entrypoint to anyone who can reach the dashboard, so the runner
gets a one-time bootstrap token (`BOOTSTRAP_TOKEN`) that it exchanges for its job token on
start; a job token or record key in the launch spec is dropped. The Jobs REST API passes
nothing of this process's environment to Ray. On the node, Ray starts the entrypoint with
the raylet's environment plus `runtime_env.env_vars`; the entrypoint therefore re-executes
the interpreter with exactly the env_vars it was sent (the base environment and the job's
own) and the few variables Ray sets for the job (`RAY_PROVIDED`): the Ray cluster's own
environment does not reach the job either.
"""

import dataclasses
import datetime as dt
import http.client
import json
import re
import shlex
import sys
from pathlib import PurePosixPath
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

from django.conf import settings
from sf.contract import (
    INGEST_EXIT,
    INGEST_FAILED,
    RUN_DIR,
    RUN_DIR_VAR,
    Failure,
    entrypoint_code,
)

from jobs.executors.base import (
    DEFAULT_PATH,
    ENV_NAME,
    GPU_VISIBILITY_VARS,
    Capacity,
    LaunchError,
    LaunchSpec,
    Observation,
    base_env,
    check_known,
    gpu_type_matches,
    own_settings,
    passed_on,
)
from jobs.states import JobStatus

DEFAULT_TIMEOUT_S = 10.0
METADATA_CLUSTER = "sf_cluster"  # metadata key marking the Ray jobs this cluster launched
# Ray's words for a worker killed for its memory, in a failed job's message.
OUT_OF_MEMORY = re.compile(r"out.of.memory|low on memory", re.IGNORECASE)
# The resource Ray puts on a node of each GPU type it knows, and how much of it a job of that
# type asks for: any share places it on such a node, and many jobs fit on one.
ACCELERATOR = "accelerator_type:"
ACCELERATOR_SHARE = 0.001
# Never in a Ray submission: Ray shows runtime_env to anyone who can reach the dashboard.
# What Ray itself sets for the entrypoint and the job's code keeps: the GPUs Ray assigned it
# (GPU_VISIBILITY_VARS; the job's own are dropped), and what `ray.init()` in the job needs to
# join the cluster as this job's driver.
RAY_PROVIDED = frozenset({"RAY_ADDRESS", "RAY_JOB_CONFIG_JSON_ENV_VAR"}) | GPU_VISIBILITY_VARS
KEEP_VAR = "SF_ENV_KEEP"  # the names the entrypoint keeps, comma-separated
# Re-execute the interpreter with only the allowed variables. Every name comes from
# KEEP_VAR, every value from the environment Ray made: no value is in the command line.
EXEC_CLEAN = (
    "import os,sys;k=set(os.environ.pop('SF_ENV_KEEP').split(','));"
    "os.execve(sys.executable,[sys.executable,'-m','sf.runner'],"
    "{n:v for n,v in os.environ.items() if n in k})"
)


class RayApiError(Exception):
    """The Ray dashboard answered with an error, or with something that is not the Jobs API."""


class RayUnreachable(RayApiError):
    """The Ray dashboard did not answer at all (refused, reset, timed out)."""


class RayExecutor:
    # The runner exchanges a one-time SF_BOOTSTRAP_TOKEN for its job token (POST
    # /api/v1/ingest/token): what the dashboard's job list shows is spent once it started.
    BOOTSTRAP_TOKEN: ClassVar[bool] = True
    # Ray's stop is SIGTERM to the runner, SIGKILL after the Ray cluster's own
    # RAY_JOB_STOP_WAIT_TIME_S: a preemption's grace there is Ray's setting (see `preempt`).
    PREEMPT_BY_TERM: ClassVar[bool] = True
    # Ray's JobStatus (ray/dashboard/modules/job/common.py), one row per member.
    STATE_TABLE: ClassVar[dict[str, JobStatus]] = {
        # Waiting for the job's supervisor actor: its GPUs, its runtime env. Ray fails a job
        # that stays here longer than RAY_JOB_START_TIMEOUT_SECONDS (900 s by default).
        "PENDING": JobStatus.PENDING,
        # The entrypoint (the runner) was started on a node.
        "RUNNING": JobStatus.RUNNING,
        # The entrypoint exited 0.
        "SUCCEEDED": JobStatus.SUCCEEDED,
        # Non-zero exit, or Ray could not start or keep the job (see FAILURE_BY_ERROR_TYPE).
        "FAILED": JobStatus.FAILED,
        # Someone stopped the job on the Ray side. Starforge's own stops close the attempt
        # before they reach Ray, so a live attempt seen STOPPED was stopped behind Starforge's
        # back (`ray job stop`, the dashboard): an admin's stop, as Slurm's CANCELLED is, so
        # the job is STOPPED (retryable by hand, never retried automatically).
        "STOPPED": JobStatus.STOPPED,
    }

    # Why a FAILED job without an exit code failed, by Ray's JobErrorType (common.py).
    FAILURE_BY_ERROR_TYPE: ClassVar[dict[str, Failure]] = {
        # The runtime env holds only env vars: setting it up fails on a sick node, not on them.
        "RUNTIME_ENV_SETUP_FAILURE": Failure.LOST,
        # Still PENDING after RAY_JOB_START_TIMEOUT_SECONDS: the same end as Starforge's own
        # pending deadline.
        "JOB_SUPERVISOR_ACTOR_START_TIMEOUT": Failure.DEADLINE,
        # Ray refused the job's options when it created the supervisor actor.
        "JOB_SUPERVISOR_ACTOR_START_FAILURE": Failure.REJECTED,
        # No node can ever host the job as asked.
        "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE": Failure.REJECTED,
        "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE": Failure.LOST,
        # Its node or worker died (an out-of-memory kill is told apart by Ray's message).
        "JOB_SUPERVISOR_ACTOR_DIED": Failure.LOST,
        # The node could not start the entrypoint's shell.
        "JOB_ENTRYPOINT_COMMAND_START_ERROR": Failure.LOST,
        # Non-zero exit; the exit code says more (runner contract).
        "JOB_ENTRYPOINT_COMMAND_ERROR": Failure.EXIT,
    }

    @staticmethod
    def check_request(settings: dict, *, nodes: int, image: str) -> None:
        """Ray places distributed work itself: a Starforge job on Ray is one entrypoint."""
        if nodes > 1:
            raise ValueError(
                "a Ray cluster runs one entrypoint per job and places distributed work itself: "
                "submit with --nodes 1 and use Ray Train (or Ray's own placement) inside the job"
            )
        if image:
            raise ValueError("a Ray cluster runs no container images per job; leave out --image")

    @staticmethod
    def validate_settings(settings: dict) -> None:
        check_known(settings, {"address", "python", "work_dir", "timeout_s", "node_env"})
        address = settings.get("address")
        if not isinstance(address, str) or not address.strip():
            raise ValueError(
                "address is required: the URL of the Ray dashboard, e.g. http://127.0.0.1:8265"
            )
        parts = urlsplit(address)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"address must be the http(s) URL of the Ray dashboard "
                f"(e.g. http://127.0.0.1:8265), not {address!r}"
            )
        for key in ("python", "work_dir"):
            value = settings.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{key} must be a non-empty string")
        work_dir = settings.get("work_dir")
        if work_dir is not None and not work_dir.startswith("/"):
            raise ValueError(
                f"work_dir must be an absolute path on the Ray nodes, not {work_dir!r}"
            )
        node_env = settings.get("node_env", [])
        if not isinstance(node_env, list) or not all(
            isinstance(n, str) and ENV_NAME.fullmatch(n) for n in node_env
        ):
            raise ValueError(
                "node_env must be a list of variable names of the Ray nodes' environment that "
                f'jobs keep (e.g. ["LD_LIBRARY_PATH"]), not {node_env!r}'
            )
        timeout = settings.get("timeout_s")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout!r}")

    def __init__(self, cluster) -> None:
        own = own_settings(cluster.settings)
        try:
            self.validate_settings(own)
        except ValueError as exc:
            raise LaunchError(f"cluster {cluster.name}: {exc}", permanent=True) from exc
        self.cluster = cluster
        self.address = own["address"].rstrip("/")
        self.python = own.get("python") or settings.SF_RUNNER_PYTHON or sys.executable
        self.work_dir = PurePosixPath(
            own.get("work_dir") or PurePosixPath(settings.SF_VAR_DIR, "ray", cluster.name)
        )
        self.timeout_s = float(own.get("timeout_s") or DEFAULT_TIMEOUT_S)
        # Variables of the nodes' own environment an operator lets jobs keep (LD_LIBRARY_PATH
        # for a site's CUDA, say): everything else of the raylet's is dropped.
        self.node_env = frozenset(own.get("node_env") or ())

    # -- interface ---------------------------------------------------------------------------
    def submit(self, spec: LaunchSpec) -> str:
        try:
            status, text = self._request("POST", "/api/jobs/", self._job_request(spec))
        except RayUnreachable as exc:
            return self._adopt_or_retry(spec.name, str(exc))
        if status == 200:
            return spec.name
        if f"{spec.name} already exists" in text:
            return spec.name  # launched before (a worker died before recording it): adopt
        if 400 <= _refusal_status(status, text) < 500:
            raise LaunchError(f"Ray refused the job: {_last_line(text)}", permanent=True)
        return self._adopt_or_retry(
            spec.name, f"the Ray dashboard answered HTTP {status}: {_last_line(text)}"
        )

    def find(self, name: str) -> str | None:
        status, text = self._request("GET", f"/api/jobs/{quote(name, safe='')}")
        if status == 404:
            return None
        job = _parse(status, text)
        # The route also takes Ray's own job ids: only a submission of this name is ours.
        if isinstance(job, dict) and job.get("submission_id") == name:
            return name
        return None

    def poll(self, job_refs: list[str]) -> dict[str, Observation]:
        wanted = set(job_refs)
        return {
            job["submission_id"]: observe(job)
            for job in self._list_jobs()
            if job.get("submission_id") in wanted
        }

    def reap_stale(self, observations: dict[str, Observation]) -> list[str]:
        """Nothing to reap: a poll marks nothing, and Ray ends its jobs itself."""
        return []

    def starforge_objects(self) -> dict[str, Observation]:
        """The submissions this cluster made (its metadata mark) that Ray has not finished."""
        found = {}
        for job in self._list_jobs():
            name = str(job.get("submission_id") or "")
            ours = (job.get("metadata") or {}).get(METADATA_CLUSTER) == self.cluster.name
            state = str(job.get("status"))
            if ours and self.STATE_TABLE.get(state) in (JobStatus.PENDING, JobStatus.RUNNING):
                found[name] = Observation(state, name=name)
        return found

    def preempt(self, job_ref: str, grace_s: int) -> None:
        """Ray's stop: the Jobs API has no signal of its own, so the grace is the Ray
        cluster's RAY_JOB_STOP_WAIT_TIME_S, not `grace_s` (set it on the Ray head to match)."""
        self.cancel(job_ref)

    def cancel(self, job_ref: str) -> None:
        """Ask Ray to stop the job; unknown and finished jobs are fine.

        Ray stops a RUNNING job at once (SIGTERM to the runner and its children, SIGKILL after
        RAY_JOB_STOP_WAIT_TIME_S). For a PENDING job the stop is queued on its supervisor actor,
        which does not exist yet: the job leaves PENDING only when that actor starts (Ray then
        starts the runner and stops it at once, mostly before the user's code has started) or
        when RAY_JOB_START_TIMEOUT_SECONDS fails it. The REST API offers no
        better: DELETE refuses a job that is not finished, and the dashboard has no route to
        kill an actor. The ledger is not held up by this; the reconciler repeats the stop of
        closed attempts it still sees PENDING or RUNNING.
        """
        status, text = self._request("POST", f"/api/jobs/{quote(job_ref, safe='')}/stop")
        if status not in (200, 404):
            raise RayApiError(
                f"the Ray dashboard at {self.address} answered HTTP {status} to stopping "
                f"{job_ref}: {_last_line(text)}"
            )

    def capacity(self) -> Capacity:
        """The cluster's GPUs less those that jobs not launched by this cluster hold.

        The scheduler subtracts the GPUs of Starforge's own active jobs itself. Ray reports the
        cluster's GPU use through the autoscaler monitor's report (GET /api/cluster_status,
        ray/dashboard/modules/reporter/reporter_head.py; refreshed every few seconds), which
        counts every holder: this cluster's Ray jobs and everything else (other clusters' jobs,
        other users' drivers and actors). The job list does not show a job's GPUs
        (JobDetails has no entrypoint_num_gpus), so the executor's submissions carry theirs in
        their metadata.
        """
        try:
            report = _parse(*self._request("GET", "/api/cluster_status"))
            jobs = self._list_jobs()
        except RayApiError as exc:
            return Capacity(reachable=False, message=str(exc))
        usage = _dig(report, "data", "clusterStatus", "loadMetricsReport", "usage")
        if not usage:
            return Capacity(
                reachable=True, message="the Ray cluster has not reported its resources yet"
            )
        used, total = usage.get("GPU") or (0.0, 0.0)
        ours = sum(
            _gpus_held(job)
            for job in jobs
            if job.get("status") == "RUNNING"
            and (job.get("metadata") or {}).get(METADATA_CLUSTER) == self.cluster.name
        )
        # Ray gives a node whose GPUs it knows the resource "accelerator_type:<TYPE>" (A100...)
        types = sorted(k.partition(":")[2] for k in usage if k.startswith(ACCELERATOR))
        return Capacity(
            reachable=True,
            total_gpus=int(total - max(0.0, used - ours)),
            pool_gpu_types=tuple(types),
        )

    # -- helpers -----------------------------------------------------------------------------
    def _job_request(self, spec: LaunchSpec) -> dict:
        """The JobSubmitRequest body (ray/dashboard/modules/job/common.py)."""
        attempt_dir = shlex.quote(str(self.work_dir / spec.name))
        env_vars = self._job_env(spec)
        env_vars[KEEP_VAR] = ",".join(sorted(set(env_vars) | RAY_PROVIDED | self.node_env))
        return {
            "submission_id": spec.name,
            "entrypoint": (
                f"mkdir -p {attempt_dir} && cd {attempt_dir} && "
                f"exec {shlex.quote(self.python)} -c {shlex.quote(EXEC_CLEAN)}"
            ),
            "entrypoint_num_gpus": spec.total_gpus,
            **self._accelerator(spec.gpu_type),
            "runtime_env": {"env_vars": env_vars},
            "metadata": {
                METADATA_CLUSTER: self.cluster.name,
                "sf_run_id": spec.run_id,
                "sf_attempt": str(spec.attempt),
                "sf_job_id": str(spec.job_id),
                "sf_team": spec.team,
                # GPUs in all, under the key the jobs already on Ray carry (`_gpus_held`)
                "sf_gpus": str(spec.total_gpus),
            },
        }

    def _accelerator(self, wanted: str) -> dict:
        """The entrypoint's placement on a node of GPU type `wanted` (nothing for any type):
        a sliver of that node's `accelerator_type:<TYPE>` resource, in Ray's spelling of the
        type ("a100" is Ray's "A100")."""
        if not wanted:
            return {}
        types = self.capacity().pool_gpu_types
        kind = next((t for t in types if gpu_type_matches(wanted, t)), wanted)
        return {"entrypoint_resources": {f"{ACCELERATOR}{kind}": ACCELERATOR_SHARE}}

    def _job_env(self, spec: LaunchSpec) -> dict[str, str]:
        """The job's whole environment: the base and its own env, less what it may not set.

        HOME is the attempt's run dir on the node; PATH has the interpreter's dir first, so
        `python train.py` means the runner's interpreter. GPU visibility is Ray's (from
        entrypoint_num_gpus), and the runner's secrets never travel in a Ray submission.
        """
        run_dir = str(self.work_dir / spec.name / RUN_DIR)
        python_dir = str(PurePosixPath(self.python).parent) if "/" in self.python else ""
        path = f"{python_dir}:{DEFAULT_PATH}" if python_dir else DEFAULT_PATH
        env = base_env(run_dir, path=path)
        env.update(passed_on(spec.env, spec_is_public=self.BOOTSTRAP_TOKEN))
        env.pop(KEEP_VAR, None)
        env[RUN_DIR_VAR] = run_dir
        return env

    def _adopt_or_retry(self, name: str, why: str) -> str:
        """No clear answer to a submit: the job may exist all the same, so look before failing."""
        try:
            found = self.find(name)
        except RayApiError:
            found = None
        if found:
            return found
        raise LaunchError(why, permanent=False)

    def _list_jobs(self) -> list[dict]:
        jobs = _parse(*self._request("GET", "/api/jobs/"))
        if not isinstance(jobs, list):
            raise RayApiError(f"the Ray dashboard at {self.address} did not list jobs")
        return [job for job in jobs if isinstance(job, dict)]

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        """One HTTP exchange with the dashboard: (status, body text), or RayUnreachable."""
        url = urlsplit(self.address)
        connection_class = (
            http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        )
        connection = connection_class(url.hostname or "", url.port, timeout=self.timeout_s)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            connection.request(method, url.path + path, body=data, headers=headers)
            response = connection.getresponse()
            return response.status, response.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise RayUnreachable(
                f"cannot reach the Ray dashboard at {self.address}: {reason}"
            ) from exc
        finally:
            connection.close()


def observe(job: dict) -> Observation:
    """One Ray job (a JobDetails of GET /api/jobs/) as an observation, with Ray's own times.

    Ray's start_time is when the job was submitted, its end_time when the job reached its
    end (ms since the epoch; ray/dashboard/modules/job/job_manager.py, common.py). A Ray job is
    the whole attempt (Ray places the job's distributed work itself), so they are the engine's
    record of it. The start is the submission, not the runner's: billing from it would bill
    the time spent PENDING (Ray's queue), so it only bounds the bill, which starts at the
    tick that first sees the job RUNNING or at the runner's start report.
    """
    seen = _observe_state(job)
    return dataclasses.replace(
        seen,
        engine_start=_from_ms(job.get("start_time")),
        engine_end=seen.end_time,  # Ray's end_time, once the job ended
        engine_start_bills=False,
    )


def _observe_state(job: dict) -> Observation:
    state = str(job.get("status"))
    message = job.get("message") or ""
    details = {
        key: job.get(key) for key in ("error_type", "driver_exit_code", "start_time", "end_time")
    }
    end_time = _from_ms(job.get("end_time"))
    if state == "SUCCEEDED":
        return Observation(state, exit_code=0, end_time=end_time, message=message, details=details)
    if state == "STOPPED":
        message = (
            "stopped on the Ray cluster, not through Starforge (ray job stop or the dashboard)"
        )
        return Observation(state, end_time=end_time, message=message, details=details)
    if state == "FAILED":
        exit_code, failure, message = _failure(job, message)
        return Observation(
            state,
            exit_code=exit_code,
            end_time=end_time,
            message=message,
            failure=failure,
            details=details,
        )
    return Observation(state, message=message, details=details)


def _failure(job: dict, message: str) -> tuple[int | None, Failure, str]:
    """(exit code, failure, message) of a FAILED job, by the runner's exit-code contract."""
    code = job.get("driver_exit_code")
    if code == INGEST_EXIT:
        # The runner's own words are in the log tail that Ray puts in its message.
        said = re.findall(rf"{re.escape(INGEST_FAILED)}: .*", message)
        why = said[-1] if said else f"{INGEST_FAILED} (exit {code}): {message}"
        return None, Failure.INGEST, why
    if isinstance(code, int):
        # -N: the runner itself was killed by signal N; 128+N: its entrypoint was (contract).
        return entrypoint_code(code), Failure.EXIT, message
    error_type = str(job.get("error_type"))
    failure = RayExecutor.FAILURE_BY_ERROR_TYPE.get(error_type, Failure.LOST)
    if failure == Failure.LOST and OUT_OF_MEMORY.search(message):
        failure = Failure.OOM
    return None, failure, message


def _gpus_held(job: dict) -> float:
    try:
        return float(job["metadata"]["sf_gpus"])
    except (KeyError, TypeError, ValueError):
        return 0.0


def _refusal_status(status: int, text: str) -> int:
    """The status of the refusal behind a dashboard 500.

    The dashboard forwards a submit to the head node's job agent and wraps the agent's answer:
    an agent's 400 (a bad request) comes back as a 500 "Request failed with status code 400".
    """
    inner = re.search(r"Request failed with status code (\d{3})", text)
    return int(inner.group(1)) if inner else status


def _last_line(text: str) -> str:
    """Ray answers errors with a traceback: its last line is the sentence."""
    lines = [line.strip() for line in text.splitlines() if line.strip(" .")]
    return lines[-1] if lines else "no details"


def _parse(status: int, text: str) -> Any:
    if status >= 400:
        raise RayApiError(f"the Ray dashboard answered HTTP {status}: {_last_line(text)}")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RayApiError(f"the Ray dashboard answered something that is not JSON: {exc}") from exc


def _dig(value: Any, *keys: str) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _from_ms(value: Any) -> dt.datetime | None:
    """Ray's milliseconds since the epoch; None where it gave none (or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return dt.datetime.fromtimestamp(value / 1000, dt.UTC)
