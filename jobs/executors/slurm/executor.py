"""Slurm executor: each attempt is one batch job whose batch step is the job-side runner.

It talks to Slurm through its commands (sbatch, squeue, scancel, sinfo, sacct), so it works with
any Slurm the worker host is a client of. Each attempt gets a directory under `work_dir`
(visible to the nodes) named deterministically from run_id + attempt: the runner's files
(`exit.json`, `console.log`), Slurm's output files and `slurm_job_id`, the id sbatch returned.

At most once per attempt (docs/ARCHITECTURE.md, invariant 4) is the ledger's: the launcher
claims an attempt before it calls `submit`, and a launcher taking over a dead one's claim
first asks `find`, which asks Slurm for a job of the attempt's name (squeue, then sacct), never
a worker's disk. Workers on other hosts therefore need not share `work_dir`: only the nodes and
the worker that polls read the runner's files there. `submit` on its own is idempotent on one
host: under a lock in the attempt dir, an attempt this host submitted before (its
`slurm_job_id` is there) is adopted from Slurm by name, so submits of many attempts run in
parallel and two of the same one never both reach sbatch.

The job's environment is an allow-list (docs/ARCHITECTURE.md, invariant 8): `base_env` (HOME is the
attempt's run dir unless `home` is set, PATH the `path` setting with the interpreter's dir
first) plus the launch spec's env, less any GPU visibility variable (Slurm sets those from the
GRES it allocated). It reaches Slurm through `--export-file` on an anonymous file, with no
`--export`: sbatch then takes the file as the job's whole environment and adds nothing of its
own process's (checked against Slurm 22.05 by test_slurm_isolation.py; `--export=NONE` or `NIL`
would instead load the service account's login environment on the node, and `NONE` ignores the
file). The Slurm commands themselves run with a minimal environment (no secret of the worker
ever reaches sbatch), and a job's variables (SBATCH_*, SLURM_CONF) cannot change how it is
submitted.

Job code runs as the same unix user as the runner and can write to the attempt dir, so the
runner's `exit.json` counts only when its mac verifies (`read_record`), and even then it never
ends an attempt while Slurm still reports the job: see `_stale_runner_exit` and `reap_stale`.
A poll only asks (squeue, sacct) and reads the runner's files; it cancels nothing.

A multi-node attempt (`spec.nodes` > 1) is one batch job of `--nodes N --ntasks-per-node 1`
with `--gres=gpu[:type]:G` per node. Its batch step, on the allocation's first node, is the one
runner of the attempt: told `SF_RANK_LAUNCH=srun`, it starts one `srun` step per rank
(`sf.ranks`), ends them all when one fails, and signs the ranks into its records, which a poll
passes on (`ranks`, `failed_rank`). Slurm's `--nodes N` means N distinct nodes, so capacity
reports each node on its own (`ranks_share_nodes=False`), with its GRES type. scancel of the
job ends every step, and so every rank, with it.

A poll of a job that holds nodes names them (`details["nodes"]`: its NodeList, rank r on the
r-th, as `sf.ranks` starts them), so the ledger keeps where every attempt ran, single-node ones
too. An attempt whose job hung before (`LaunchSpec.avoid_nodes`) is submitted with
`--exclude` of the nodes those attempts ran on, as many as leave the job enough of the
partition's nodes (`jobs.executors.base.nodes_to_avoid`).
"""

import datetime as dt
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

from django.conf import settings
from sf.contract import (
    BACKEND_PREFIX,
    EXIT_FILE,
    GPUS_PER_NODE_VAR,
    INGEST_EXIT,
    INGEST_FAILED,
    NUM_NODES_VAR,
    RANK_LAUNCH_VAR,
    RUN_DIR_VAR,
    STARTED_FILE,
    Failure,
    file_env,
)

from jobs.executors.base import (
    DEFAULT_PATH,
    Capacity,
    LaunchError,
    LaunchSpec,
    NodeCapacity,
    Observation,
    base_env,
    check_known,
    epoch,
    file_lock,
    gpu_type_matches,
    nodes_to_avoid,
    passed_on,
    rank_details,
    read_record,
)
from jobs.executors.slurm.commands import (
    COMMAND_TIMEOUT_S,
    Run,
    SlurmError,
    run_command,
    sentence,
    transient,
)
from jobs.executors.slurm.parse import (
    POLL_FIELDS,
    JobRow,
    NodeRow,
    exit_code_of,
    expand_hostlist,
    gpu_count,
    gpu_gres_type,
    parse_sacct,
    parse_squeue,
    usable_node_state,
)
from jobs.executors.slurm.sbatch import export_file, sbatch_args
from jobs.states import JobStatus

S = JobStatus
CAPACITY_TTL_S = 1.0  # below the scheduler's 2 s tick: each tick asks Slurm afresh
# States that hold an allocation, for counting Starforge's own GPUs on the nodes.
ALLOCATED_STATES = "CONFIGURING,RUNNING,COMPLETING,SUSPENDED,STOPPED,SIGNALING,RESIZING,STAGE_OUT"
# FAILED reasons that mean the runner ran and exited (or was killed): its status is the answer.
RUNNER_ENDS = frozenset({"NonZeroExitCode", "None", ""})
TIME_LIMIT = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
SETTINGS = {
    "partition": "partition to submit to (default: the cluster's default partition)",
    "account": "account to charge (default: the submitting user's default account)",
    "slurmrestd_url": "slurmrestd endpoint (not supported yet: the executor uses the commands)",
    "python": "interpreter on the nodes that has the sf client (default SF_RUNNER_PYTHON)",
    "work_dir": "directory shared with the nodes for attempt dirs and output files",
    "bin_dir": "directory of sbatch, squeue, scancel, sinfo, sacct (default: the PATH)",
    "slurm_conf": "slurm.conf of this cluster for the commands (default: $SLURM_CONF)",
    "time_limit": "time limit of every job, in Slurm's --time format, e.g. 2-00:00:00",
    "home": "HOME of every job on the nodes (default: the attempt's own run dir)",
    "path": f"PATH of every job, after the interpreter's dir (default {DEFAULT_PATH})",
}

_capacities: dict[tuple[str, ...], tuple[float, Capacity]] = {}  # capacity() answers, by cluster


class SlurmExecutor:
    # The runner gets the job token and the record key in its environment (the anonymous
    # export file). Slurm keeps that environment in slurmctld's state; `sacct --env-vars`
    # shows it to the job's unix user only where AccountingStoreFlags=job_env is set.
    BOOTSTRAP_TOKEN: ClassVar[bool] = False
    PREEMPT_BY_TERM: ClassVar[bool] = True  # scancel --signal reaches the job's steps too
    # A retry after a hang is kept off the nodes the hung attempt ran on (sbatch --exclude).
    AVOIDS_NODES: ClassVar[bool] = True
    # Every job state Slurm reports (22.05 and later: base states, then the flags that squeue
    # or the REST API show instead of the base state). COMPLETED and FAILED end with the
    # runner's exit code; the other ends carry the failure kind from END_STATES below.
    STATE_TABLE: ClassVar[dict[str, JobStatus]] = {
        "PENDING": S.PENDING,  # queued; the reason (Resources, Priority, ...) is the message
        "RUNNING": S.RUNNING,  # the batch step (the runner) is running
        "SUSPENDED": S.RUNNING,  # scontrol suspend: frozen, still holds its GPUs, resumes later
        "COMPLETED": S.SUCCEEDED,  # the runner exited 0
        "CANCELLED": S.STOPPED,  # scancel outside Starforge (a stop from the ledger closes the
        # attempt before it cancels, so the reconciler never sees its own stops here)
        "FAILED": S.FAILED,  # non-zero exit of the runner: exit code, INGEST_EXIT, 128+N signal
        "TIMEOUT": S.FAILED,  # hit the time limit: the job's own is a stop (the reconciler
        # says so); a partition's is retryable, and a retry resumes from checkpoints
        "NODE_FAIL": S.FAILED,  # the node died under the job
        "PREEMPTED": S.FAILED,  # preempted by a higher-priority job
        "BOOT_FAIL": S.FAILED,  # the node could not be booted for the job
        "DEADLINE": S.FAILED,  # could not finish by its --deadline (set by the site, not us)
        "OUT_OF_MEMORY": S.FAILED,  # killed by the memory limit
        # Flags, shown instead of the base state:
        "COMPLETING": S.RUNNING,  # ended, epilog running; not final until COMPLETED/FAILED/...
        "CONFIGURING": S.PENDING,  # allocated, nodes booting: the runner has not started
        "POWER_UP_NODE": S.PENDING,  # allocated powered-down nodes, waiting for them to boot
        "EXPEDITING": S.PENDING,  # eligible at once with top priority, not started yet
        "RECONFIG_FAIL": S.PENDING,  # node reconfiguration failed; Slurm requeues or ends it
        "LAUNCH_FAILED": S.PENDING,  # the launch failed; Slurm requeues or ends it next
        "RESV_DEL_HOLD": S.PENDING,  # held because its reservation was deleted: waits for a
        # release, and the ledger's pending deadline ends the wait
        "STAGE_OUT": S.RUNNING,  # burst-buffer stage-out after the script: not final yet
        "SIGNALING": S.RUNNING,  # a signal to the running job is on its way
        "RESIZING": S.RUNNING,  # a running job changing size
        "STOPPED": S.RUNNING,  # SIGSTOP with resources kept (scontrol suspend variant)
        "UPDATE_DB": S.RUNNING,  # the job's start is being re-sent to slurmdbd: it started
        # Requeues: jobs are submitted with --no-requeue, so these mean a forced requeue. A
        # rerun under the same attempt would restart the runner's log and metric numbering,
        # so the attempt ends here and Starforge's own retry makes the next one; the
        # reconciler's orphan sweep cancels Slurm's rerun if it comes back.
        "REQUEUED": S.FAILED,
        "REQUEUE_FED": S.FAILED,
        "REQUEUE_HOLD": S.FAILED,
        "SPECIAL_EXIT": S.FAILED,  # REQUEUE_HOLD for a special exit value
        "REVOKED": S.FAILED,  # federation: a sibling cluster took the job; it will not run here
    }
    # Ends other than the runner's own exit: (failure kind, message).
    END_STATES: ClassVar[dict[str, tuple[str, str]]] = {
        "CANCELLED": ("", "cancelled on the Slurm cluster outside Starforge (scancel)"),
        # The job's own --time-limit (the reconciler stops it as such) or the partition's.
        "TIMEOUT": (Failure.TIMEOUT, "reached the Slurm time limit"),
        "NODE_FAIL": (Failure.LOST, "the Slurm node running the job failed"),
        "PREEMPTED": (Failure.PREEMPTED, "preempted by Slurm"),
        "BOOT_FAIL": (Failure.LOST, "the Slurm node could not be booted for the job"),
        "DEADLINE": (Failure.LOST, "Slurm ended the job at its deadline"),
        "OUT_OF_MEMORY": (Failure.OOM, "out of memory"),
        "REQUEUED": (Failure.PREEMPTED, "requeued by Slurm; Starforge retries it as a new attempt"),
        "REQUEUE_FED": (Failure.PREEMPTED, "requeued by the Slurm federation"),
        "REQUEUE_HOLD": (Failure.PREEMPTED, "requeued and held by Slurm"),
        "SPECIAL_EXIT": (Failure.PREEMPTED, "requeued and held by Slurm (special exit)"),
        "REVOKED": (
            Failure.LOST,
            "revoked: a sibling cluster of the Slurm federation took the job",
        ),
    }

    @staticmethod
    def validate_settings(settings: dict) -> None:
        check_known(settings, set(SETTINGS))
        if settings.get("slurmrestd_url"):
            raise ValueError(
                "slurmrestd_url is not supported yet: the Slurm executor uses the Slurm "
                "commands (sbatch, squeue, scancel, sinfo) on the worker host; leave it out"
            )
        for key in (
            "partition",
            "account",
            "python",
            "work_dir",
            "bin_dir",
            "slurm_conf",
            "home",
            "path",
        ):
            value = settings.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{key} must be a non-empty string, not {value!r}")
        for key in ("python", "work_dir", "bin_dir", "slurm_conf", "home"):
            if settings.get(key) and not os.path.isabs(settings[key]):
                raise ValueError(f"{key} must be an absolute path, not {settings[key]!r}")
        limit = settings.get("time_limit")
        if limit is not None and (isinstance(limit, bool) or not TIME_LIMIT.match(str(limit))):
            raise ValueError(
                f"time_limit {limit!r} is not a Slurm time: use minutes, HH:MM:SS or "
                "D-HH:MM:SS (e.g. 2-00:00:00)"
            )

    def __init__(self, cluster, run: Run | None = None) -> None:
        self.cluster = cluster
        conf = cluster.settings
        self.partition: str = conf.get("partition", "")
        self.account: str = conf.get("account", "")
        self.python: str = conf.get("python") or settings.SF_RUNNER_PYTHON or sys.executable
        default_dir = Path(settings.SF_VAR_DIR) / "slurm" / cluster.name
        self.work_dir = Path(conf.get("work_dir") or default_dir)
        self.bin_dir: str = conf.get("bin_dir", "")
        self.slurm_conf: str = conf.get("slurm_conf") or os.environ.get("SLURM_CONF", "")
        self.time_limit = str(conf.get("time_limit", ""))
        self.home: str = conf.get("home", "")
        self.path: str = conf.get("path") or DEFAULT_PATH
        self._run = run or run_command

    # -- interface ---------------------------------------------------------------------------
    def submit(self, spec: LaunchSpec) -> str:
        attempt_dir = self.work_dir / spec.name
        submitted = attempt_dir / "slurm_job_id"
        try:
            with file_lock(attempt_dir / ".submit.lock"):
                # Only the file's presence counts: the job can write to its attempt dir.
                if submitted.exists() and (adopted := self.find(spec.name)):
                    return adopted
                job_id = self._sbatch(spec, attempt_dir)
                submitted.write_text(job_id)
                return job_id
        except SlurmError as exc:
            raise LaunchError(str(exc), permanent=not transient(str(exc))) from exc

    def find(self, name: str) -> str | None:
        """The first Slurm job of this name: squeue while slurmctld keeps it (MinJobAge), then
        accounting (where there is: without slurmdbd sacct fails, and nothing is found)."""
        out = self._slurm(["squeue", "-h", "--all", "-t", "all", "-n", name, "-O", "JobID:|"])
        ids = [line.strip("|") for line in out.splitlines() if line.strip()]
        if not ids:
            args = ["sacct", "-n", "-P", "-X", "-a", "-S", "now-7days", "-o", "JobID"]
            try:
                ids = self._slurm([*args, f"--name={name}"]).split()
            except SlurmError:
                ids = []
        ids = sorted((i for i in ids if i.isdigit()), key=int)
        return ids[0] if ids else None

    def poll(self, job_refs: list[str]) -> dict[str, Observation]:
        """One squeue for every job; sacct (when accounting works) for those it forgot."""
        ids = sorted({ref for ref in job_refs if ref.isdigit()}, key=int)
        if not ids:
            return {}
        args = ["squeue", "-h", "--all", "-t", "all", "-j", ",".join(ids), "-O", POLL_FIELDS]
        try:
            rows = parse_squeue(self._slurm(args), dt.datetime.now(dt.UTC))
        except SlurmError as exc:
            if "Invalid job id" not in str(exc):  # squeue -j of one forgotten id says so
                raise
            rows = []
        found = {row.job_id: self._observe(row) for row in rows if row.job_id in ids}
        missing = [i for i in ids if i not in found]
        if missing:
            found.update({row.job_id: self._observe(row) for row in self._sacct(missing)})
        return found

    def starforge_objects(self) -> dict[str, Observation]:
        """This user's Slurm jobs named `sf-…` (BACKEND_PREFIX) that have not ended, in one
        squeue."""
        states = f"PENDING,CONFIGURING,{ALLOCATED_STATES}"
        args = ["squeue", "-h", "-u", str(os.getuid()), "-t", states, "-O", POLL_FIELDS]
        rows = parse_squeue(self._slurm(args), dt.datetime.now(dt.UTC))
        return {
            row.job_id: Observation(row.state, name=row.name)
            for row in rows
            if row.name.startswith(BACKEND_PREFIX)
        }

    def cancel(self, job_ref: str) -> None:
        # scancel exits 0 for unknown and finished jobs alike: the call is idempotent.
        self._slurm(["scancel", job_ref])

    def preempt(self, job_ref: str, grace_s: int) -> None:
        """The job's signal: SIGTERM to every step, the batch step (the runner) included; the
        runner writes the notice and kills the job `grace_s` later (SF_STOP_GRACE_S). The
        cancel after the grace is the reconciler's."""
        self._slurm(["scancel", "--signal=TERM", "--full", job_ref])

    def capacity(self) -> Capacity:
        """GPUs of the partition's usable nodes, less those that jobs outside Starforge hold,
        in all (`total_gpus`) and per node (`nodes`: its name, those GPUs, its GRES type).

        The scheduler subtracts the GPUs of Starforge's own active jobs itself, so only
        foreign load is taken off here: node GPUs in use minus those of `sf-` jobs. Answers
        are kept CAPACITY_TTL_S: every submit asks too, and the two Slurm commands cost more
        than the rest of a submit; the TTL is below the tick, so a tick gets a fresh one.
        """
        key = (self.cluster.name, self.partition, self.slurm_conf, self.bin_dir)
        kept = _capacities.get(key)
        if kept and time.monotonic() - kept[0] < CAPACITY_TTL_S:
            return kept[1]
        capacity = self._ask_capacity()
        _capacities[key] = (time.monotonic(), capacity)
        return capacity

    def _ask_capacity(self) -> Capacity:
        try:
            nodes, unusable = self._partition_nodes()
            ours = self._starforge_gpus(list(nodes)) if nodes else {}
        except SlurmError as exc:
            return Capacity(reachable=False, message=str(exc))
        total = sum(node.gpus for node in nodes.values())
        # "" holds what a Starforge job holds on nodes squeue did not name (counted in all)
        mine = sum(gpus for node, gpus in ours.items() if node in nodes or not node)
        foreign = max(0, sum(node.used for node in nodes.values()) - mine)
        each = tuple(
            NodeCapacity(name, node.gpus - max(0, node.used - ours.get(name, 0)), node.gpu_type)
            for name, node in nodes.items()
        )
        where = f"partition {self.partition}" if self.partition else "the default partition"
        seen = ", ".join(unusable) if unusable else "none listed"
        message = "" if nodes else f"{where} has no usable nodes ({seen})"
        return Capacity(
            reachable=True,
            total_gpus=max(0, total - foreign),
            message=message,
            nodes=each,
            ranks_share_nodes=False,  # --nodes N: N distinct nodes, one rank on each
        )

    # -- submit ------------------------------------------------------------------------------
    def _sbatch(self, spec: LaunchSpec, attempt_dir: Path) -> str:
        args = sbatch_args(
            spec,
            attempt_dir,
            gres_type=self._gres_type(spec.gpu_type) if spec.total_gpus > 0 else "",
            partition=self.partition,
            account=self.account,
            time_limit=self.time_limit,
            exclude=self._exclude(spec),
        )
        with export_file(self._job_env(spec, attempt_dir)) as fd:
            args += [f"--export-file={fd}", f"--wrap=exec {shlex.quote(self.python)} -m sf.runner"]
            out = self._slurm(args, fds=(fd,))
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()!r}, not a job id")
        return job_id

    def _exclude(self, spec: LaunchSpec) -> list[str]:
        """The partition's nodes the attempt is kept off: those its job's hung attempts ran on,
        as many as leave it enough nodes (`nodes_to_avoid`, the scheduler's rule too)."""
        if not spec.avoid_nodes:
            return []
        return nodes_to_avoid(spec.avoid_nodes, self.capacity(), spec.nodes, spec.gpu_type)

    def _gres_type(self, wanted: str) -> str:
        """The partition's own spelling of GPU type `wanted` ("" for any): Slurm matches GRES
        types exactly, Starforge as `gpu_type_matches` does ("A100" is Slurm's "a100")."""
        if not wanted:
            return ""
        types = self.capacity().gpu_types
        if wanted in types:
            return wanted
        return next((t for t in types if gpu_type_matches(wanted, t)), wanted)

    def _job_env(self, spec: LaunchSpec, attempt_dir: Path) -> dict[str, str]:
        """The job's whole environment: the base, its own env and the runner's file paths,
        and for a multi-node job how the runner starts its ranks (one srun step each).

        Nothing is read from this process's environment. GPU visibility is Slurm's (from the
        GRES it allocated): submit refuses such variables, and they are dropped here too.
        """
        files = file_env(attempt_dir)
        home = self.home or files[RUN_DIR_VAR]
        # `python train.py` in a job means the runner's interpreter, as on the local executor
        env = base_env(home, path=f"{Path(self.python).parent}:{self.path}")
        env.update(passed_on(spec.env, spec_is_public=self.BOOTSTRAP_TOKEN))
        env.update(files)
        if spec.nodes > 1:
            env[RANK_LAUNCH_VAR] = "srun"
            env[NUM_NODES_VAR] = str(spec.nodes)
            env[GPUS_PER_NODE_VAR] = str(spec.gpus_per_node)
        return env

    # -- poll --------------------------------------------------------------------------------
    def _observe(self, row: JobRow) -> Observation:
        target = self.STATE_TABLE.get(row.state)
        details: dict[str, object] = {"slurm_job_id": row.job_id, "reason": row.reason}
        if target == S.PENDING:
            reason = "" if row.reason == "None" else row.reason
            return Observation(row.state, message=reason, details=details, name=row.name)
        if row.nodes:  # where it runs or ran: a retry after a hang keeps off these
            details["nodes"] = list(row.nodes)
        if row.state == "RUNNING" and (stale := self._stale_runner_exit(row)):
            details.update(stale)
        records = self.work_dir / row.name
        if target == S.RUNNING:  # a multi-node attempt's ranks, as its runner started them
            details.update(rank_details(read_record(records / STARTED_FILE, row.name)))
        if target == S.RUNNING or target is None:
            return Observation(
                row.state,
                start_time=_latest_start(row),
                details=details,
                name=row.name,
                engine_start=row.start,
            )
        details["exit_status"] = row.exit_status
        done = read_record(records / EXIT_FILE, row.name)
        details.update(rank_details(done))  # ...and how each ended, which one failed first
        runner_end = epoch(done.get("ended_at"))  # signed: job code cannot move it
        if target == S.SUCCEEDED:
            return _ended(row, details, runner_end, exit_code=0)
        if row.state == "CANCELLED" and (ended := self._cancelled_after_runner_exit(row, details)):
            return ended
        if row.state != "FAILED":
            failure, message = self.END_STATES[row.state]
            return _ended(row, details, runner_end, failure=failure, message=message)
        if row.reason not in RUNNER_ENDS and not row.reason.startswith("RaisedSignal"):
            # Slurm failed the job itself (a launch or prolog failure): the runner never ran
            return _ended(
                row,
                details,
                runner_end,
                failure=Failure.LOST,
                message=f"Slurm failed the job: {row.reason}",
            )
        code = exit_code_of(row.exit_status or 0)
        if code != INGEST_EXIT:
            return _ended(row, details, runner_end, exit_code=code, failure=Failure.EXIT)
        reason = str(done.get("reason", ""))
        if not reason.startswith(INGEST_FAILED):  # the server cannot see the runner's files
            reason = (
                f"{INGEST_FAILED}: the runner could not prepare the job (exit {INGEST_EXIT}); "
                f"see {records / 'slurm.err'}"
            )
        return _ended(
            row, details, runner_end, exit_code=code, failure=Failure.INGEST, message=reason
        )

    def _stale_runner_exit(self, row: JobRow) -> dict | None:
        """Details for a job Slurm still reports RUNNING long after its runner's signed exit.

        A slurmctld that crashes while a job ends can come back with the job RUNNING, the
        completion lost, and keep it so (and its GPUs allocated) until the node next
        registers, minutes later. After SF_LOST_GRACE_S of disagreement the observation says
        so (`stale_runner_exit`, with the runner's exit code and times), but it stays RUNNING:
        a poll changes nothing on the cluster, and the ledger never closes an attempt while
        Slurm reports its job. `reap_stale` cancels such jobs; the attempt ends when Slurm
        reports the cancel (`_cancelled_after_runner_exit`). Only an exit record the runner
        signed counts: job code can write `exit.json` too. A job still running has no exit
        record, so the check is one stat per old RUNNING job.
        """
        grace = dt.timedelta(seconds=settings.SF_LOST_GRACE_S)
        now = dt.datetime.now(dt.UTC)
        if row.start is not None and now - row.start < grace:
            return None
        exit_file = self.work_dir / row.name / EXIT_FILE
        if not exit_file.exists():
            return None
        done = read_record(exit_file, row.name)
        ended, started = epoch(done.get("ended_at")), epoch(done.get("started_at"))
        if ended is None or now - ended < grace:
            return None
        lag = (now - ended).total_seconds()
        return {
            "stale_runner_exit": True,
            "runner_exit_code": _runner_code(done),
            "runner_started_at": started.isoformat() if started else None,
            "runner_ended_at": ended.isoformat(),
            "note": (
                f"Slurm still reported job {row.job_id} RUNNING {lag:.0f} s after the runner "
                "exited (its completion was lost, e.g. by a slurmctld crash): the Slurm job is "
                "cancelled, and the attempt ends when Slurm reports it gone"
            ),
        }

    def reap_stale(self, observations: dict[str, Observation]) -> list[str]:
        """Cancel the Slurm jobs that a poll found RUNNING after their runner's signed exit.

        The reconciler calls this with a poll's answer, after acting on it. Only observations
        marked `stale_runner_exit` are touched; a cancel that fails is tried again on the next
        tick (the job is still marked then). Returns the job ids cancelled.
        """
        reaped = []
        for ref, obs in observations.items():
            if obs.native_state != "RUNNING" or not obs.details.get("stale_runner_exit"):
                continue
            try:
                self.cancel(ref)
            except SlurmError:
                continue
            reaped.append(ref)
        return reaped

    def _cancelled_after_runner_exit(self, row: JobRow, details: dict) -> Observation | None:
        """A CANCELLED job whose runner had already exited ends as the runner said.

        That is how a stale RUNNING job ends once `reap_stale` cancelled it: its runner's
        signed exit lies at least SF_LOST_GRACE_S before Slurm's end. A cancel that killed
        the runner (an admin's scancel) has the runner end with it, and stays CANCELLED. The
        exit code is the runner's signed one; the end is Slurm's (the allocation was held
        until then).
        """
        done = read_record(self.work_dir / row.name / EXIT_FILE, row.name)
        ended = epoch(done.get("ended_at"))
        grace = dt.timedelta(seconds=settings.SF_LOST_GRACE_S)
        if ended is None or row.end is None or row.end - ended < grace:
            return None  # no signed exit, or the runner ended with Slurm's cancel
        code = _runner_code(done)
        failure: str  # a Failure; "" for a success
        state, failure, message = "FAILED", Failure.EXIT, ""
        if code is None:  # ingest failed: the user's code never ran
            code, failure = INGEST_EXIT, Failure.INGEST
            message = str(done.get("reason") or "the runner ended without an exit code")
        elif code == 0:
            state, failure = "COMPLETED", ""
        note = (
            f"Slurm reported job {row.job_id} CANCELLED after the runner had exited: the "
            "runner's signed exit record gives the outcome, and the attempt is billed until "
            "Slurm's end"
        )
        return Observation(
            state,
            exit_code=code,
            start_time=_latest_start(row) or epoch(done.get("started_at")),
            end_time=row.end,
            message=message,
            failure=failure,
            details={**details, "reason": "runner exited", "note": note},
            name=row.name,
            engine_start=row.start,
            engine_end=row.end,
        )

    def _sacct(self, ids: list[str]) -> list[JobRow]:
        """Jobs squeue no longer lists (older than MinJobAge), from accounting when there is.

        Without slurmdbd sacct exits non-zero: the jobs stay absent, and the reconciler's
        grace period decides when they count as lost.
        """
        args = ["sacct", "-n", "-P", "-X", "-j", ",".join(ids)]
        args += ["-o", "JobID,State,Reason,Start,End,ExitCode,NodeList,JobName"]
        try:
            return parse_sacct(self._slurm(args), dt.datetime.now(dt.UTC))
        except SlurmError:
            return []

    # -- capacity ----------------------------------------------------------------------------
    def _partition_nodes(self) -> tuple[dict[str, NodeRow], list[str]]:
        """The partition's nodes that take jobs, by node name, and "node state" of each one
        that does not (for the capacity message)."""
        # NodeList: with -N, the node's name, as squeue -w, srun and the ranks name it (its
        # NodeHost may differ, or be shared by the nodes of several slurmd on one host)
        args = ["sinfo", "-h", "-N", "-O", "NodeList:|,Partition:|,StateLong:|,Gres:|,GresUsed:|"]
        if self.partition:
            args[1:1] = ["-p", self.partition]
        nodes = {}
        unusable = []
        for line in self._slurm(args).splitlines():
            fields = line.split("|")
            if len(fields) < 5:
                continue
            node, partition, state, gres, used = fields[:5]
            in_partition = (
                partition.rstrip("*") == self.partition if self.partition else partition[-1:] == "*"
            )
            if not in_partition:
                continue
            if usable_node_state(state):
                nodes[node] = NodeRow(gpu_count(gres), gpu_count(used), gpu_gres_type(gres))
            else:
                unusable.append(f"{node} {state}")
        return nodes, unusable

    def _starforge_gpus(self, nodes: list[str]) -> dict[str, int]:
        """{node: GPUs Starforge's jobs hold there} on these nodes, from their per-node GRES
        (a job of N nodes holds its tres-per-node on each); "" for a job squeue names no
        node of."""
        args = ["squeue", "-h", "--all", "-t", ALLOCATED_STATES, "-w", ",".join(nodes)]
        out = self._slurm(args + ["-O", "tres-per-node:|,Name:|,NodeList:|"])
        held: dict[str, int] = {}
        for line in out.splitlines():
            tres, name, nodelist = (line.split("|") + ["", ""])[:3]
            if name.startswith(BACKEND_PREFIX):
                for node in expand_hostlist(nodelist) or [""]:
                    held[node] = held.get(node, 0) + gpu_count(tres)
        return held

    # -- commands ----------------------------------------------------------------------------
    def _slurm(self, args: list[str], fds: tuple[int, ...] = ()) -> str:
        """Run one Slurm command; its stdout, or SlurmError with Slurm's own words."""
        command = [os.path.join(self.bin_dir, args[0]) if self.bin_dir else args[0], *args[1:]]
        # A minimal environment: the worker's PATH finds the commands, and nothing else of
        # the worker's (secrets, SLURM_EXPORT_ENV, SBATCH_*) reaches them or a job.
        env = {
            "PATH": os.environ.get("PATH") or DEFAULT_PATH,
            "SLURM_TIME_FORMAT": "%s",  # times as epoch seconds
        }
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        try:
            done = self._run(command, env, fds)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{args[0]} did not answer within {COMMAND_TIMEOUT_S} s") from None
        except OSError as exc:
            raise SlurmError(f"cannot run {command[0]}: {exc.strerror or exc}") from exc
        if done.returncode != 0:
            words = (done.stderr or done.stdout or "").strip()
            raise SlurmError(f"{args[0]}: {sentence(words) or f'exited {done.returncode}'}")
        return done.stdout


def _ended(row: JobRow, details: dict, runner_end: dt.datetime | None, **fields) -> Observation:
    """An ended job's observation: billed from the latest instant Slurm's whole-second Start
    allows to the runner's signed exit where it wrote one (it exits just before Slurm
    completes the job), else Slurm's End; Slurm's own times beside them, which bound the
    bill (`jobs.ledger.clocks`)."""
    return Observation(
        row.state,
        start_time=_latest_start(row),
        end_time=runner_end or row.end,
        details=details,
        name=row.name,
        engine_start=row.start,
        engine_end=row.end,
        **fields,
    )


def _latest_start(row: JobRow) -> dt.datetime | None:
    """The latest instant the allocation can have begun: Slurm's whole-second Start cuts the
    instant short, so it lies before Start + 1 s (and before now, when squeue answered)."""
    if row.start is None:
        return None
    return min(row.start + ENGINE_SECOND, dt.datetime.now(dt.UTC))


ENGINE_SECOND = dt.timedelta(seconds=1)


def _runner_code(record: dict) -> int | None:
    """The exit code in a runner's exit record; None when ingest failed (no code)."""
    code = record.get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None
