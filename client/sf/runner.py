"""Owns the job-side runner (`python -m sf.runner`): one attempt of a job, step by step.

Executors start it with the SF_* environment; what both sides rely on (exit codes, file names,
how records are signed) is `sf.contract`. Standard library only: it runs inside arbitrary job
images. Exit `INGEST_EXIT` means ingest failed and the user's code never ran.

The steps, in order: guard the runner and take back the job's priority; read the environment
(`sf.environment`); fetch and unpack the snapshot (`sf.ingest`); plan the ranks (`sf.ranks`);
open the sandbox where the executor asked for one (`sf.sandbox`); start every rank, write
started.json and report the start; ship the output and metrics (the SDK's, TensorBoard's:
`sf.tensorboard`) while they run (`sf.shipping`); end all when one fails (`sf.supervise`);
write the signed exit record. A sandboxed job reaches MLflow's tracking endpoint through the
runner's forwarder (`sf.tracking`).

The job's code is hostile. The runner keeps its credentials (job token, record key) out of the
job's environment and makes itself non-dumpable, so a job of the same uid can neither read its
/proc environ nor ptrace it; it signs started.json and exit.json with SF_RECORD_KEY so a record
the job wrote decides nothing; it is a child subreaper and ends every process the job left
(setsid and double forks included) before it writes exit.json. With SF_RUN_AS_UID it stays root
and runs the job as that uid, with its own directories and nothing else of the attempt's.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from sf.activity import (
    ActivityCounts,
    ActivityReporter,
    CountingLineSink,
    CountingMetricsShipper,
)
from sf.checkpoints import CheckpointWatcher, write_notice
from sf.contract import (
    API_URL_VAR,
    CONSOLE_LOG,
    INGEST_EXIT,
    INGEST_FAILED,
    NICENESS_VAR,
    PROC_FILE_VAR,
    RUN_AS_UID_VAR,
    SNAPSHOT_VAR,
    TRACKING_URI_VAR,
    exit_status,
    record_mac,
)
from sf.environment import JobIdentity, RunnerEnv, child_env, install_sdk
from sf.http import Client
from sf.ingest import IngestError, exchange_bootstrap, fetch_snapshot, resolve_entrypoint
from sf.ranks import RankPlan, RankPlanError, plan_ranks, rank_states, terminator
from sf.sandbox import Sandbox, SandboxConfig, SandboxError
from sf.say import say
from sf.shipping import (
    BatchShipper,
    LineSink,
    LogShipper,
    MetricsTail,
    pump,
    report_started,
)
from sf.supervise import Supervisor, guard_runner
from sf.system import SystemSampler, sample_interval
from sf.tensorboard import TensorBoardTail
from sf.tensorboard import roots as tensorboard_roots
from sf.tracking import Forwarder, direct_uri


class Terminated(Exception):
    """SIGTERM/SIGINT arrived before the child was spawned."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


def prepare(env: RunnerEnv) -> tuple[list[str], dict[str, str]]:
    """Create the directories, ingest the snapshot; return the checked argv and job env."""
    try:
        env.identity = JobIdentity.from_environ(env.environ)
        os.makedirs(env.run_dir, exist_ok=True)
        for path in env.job_dirs():
            if env.identity:
                env.identity.own_dir(path)
            else:
                os.makedirs(path, exist_ok=True)
        install_sdk(env.sdk_dir)
        # Without an API the runner runs offline (nothing to ship, nothing to exchange for).
        if env.bootstrap and not env.token and env.api_url:
            env.token = exchange_bootstrap(env.api_url, env.bootstrap, env.attempt, env.own_rank)
        client = env.client()
        if env.snapshot:
            if client is None:
                raise IngestError(f"{SNAPSHOT_VAR} is set but {API_URL_VAR} is empty")
            fetch_snapshot(client, env.snapshot, env.run_dir, env.attempt_dir)
        if env.identity:
            env.identity.own_tree(env.run_dir)
        child = child_env(env)
        return resolve_entrypoint(env.entrypoint(), env.run_dir, child.get("PATH")), child
    except (OSError, ValueError) as exc:
        raise IngestError(str(exc)) from exc


def run(env: RunnerEnv, plans: list[RankPlan]) -> int:
    """Run the ranks, in the executor's sandbox where it asked for one (`sf.sandbox`), and
    write the exit file; the sandbox is gone before the runner exits."""
    sandbox, forwarder = None, None
    try:
        config = SandboxConfig.from_environ(env.environ)
        if config is not None:
            sandbox = Sandbox.open(
                config, env.sandbox_dirs(), env.attempt_dir, readable=[env.sdk_dir]
            )
            forwarder = forward_tracking(env, plans, sandbox)
        return run_ranks(env, plans, sandbox)
    except SandboxError as exc:
        return _ingest_failed(env, f"cannot make the job's sandbox: {exc}")
    except Terminated as exc:
        say(f"stopped by signal {exc.signum} before the entrypoint started")
        return _finish(env, -exc.signum, None)
    finally:
        if forwarder is not None:
            forwarder.close()
        if sandbox is not None:
            sandbox.close()


def forward_tracking(env: RunnerEnv, plans: list[RankPlan], sandbox: Sandbox) -> Forwarder | None:
    """In a sandbox the job cannot reach the API: where its ranks got the API's tracking URI
    (`sf.tracking.tracking_env`), serve it inside their network namespace instead."""
    direct = direct_uri(env.api_url) if env.api_url else ""
    ours = [plan.env for plan in plans if direct and plan.env.get(TRACKING_URI_VAR) == direct]
    if not ours:
        return None
    try:
        forwarder = Forwarder(sandbox.listen_inside(), env.api_url)
    except ValueError as exc:
        raise SandboxError(str(exc)) from exc
    forwarder.start()
    for rank_env in ours:
        rank_env[TRACKING_URI_VAR] = forwarder.uri
    return forwarder


def start_rank(env: RunnerEnv, plan: RankPlan, sandbox: Sandbox | None) -> subprocess.Popen:
    """One rank in its own session, as the job's uid: entered into the sandbox by `nsenter`
    (which stays root until it is inside, then takes the uid), or started here directly."""
    argv, identity = plan.argv, env.identity
    drop: dict[str, Any] = identity.popen_args() if identity else {}
    if sandbox is not None:
        uid, gid = (identity.uid, identity.gid) if identity else (None, None)
        argv = sandbox.enter(argv, env.run_dir, uid, gid)
        drop = {"umask": 0o077} if identity else {}
    proc = subprocess.Popen(
        argv,
        cwd=env.run_dir,
        env=plan.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **drop,
    )
    if sandbox is not None:
        sandbox.adopt(proc.pid)
    return proc


def run_ranks(env: RunnerEnv, plans: list[RankPlan], sandbox: Sandbox | None) -> int:
    """Start every rank, stream their output and metrics, end all when one fails, and write
    the exit file. A single-node job is one rank: the job itself, as it always ran."""
    client = env.shipping_client()
    shipper = LogShipper(client, env.attempt)
    owner = env.identity.uid if env.identity else None
    counts = ActivityCounts()
    metrics_shipper = CountingMetricsShipper(client, env.attempt, counts=counts)
    metrics = MetricsTail(env.metrics_file, metrics_shipper, owner)
    console_path = os.path.join(env.attempt_dir, CONSOLE_LOG)
    spared = sandbox.helpers if sandbox is not None else None
    multi = len(plans) > 1
    with open(console_path, "a", encoding="utf-8") as console:
        began = time.time()  # the attempt's TensorBoard events are those written from now
        try:
            procs = start_ranks(env, plans, sandbox)
        except IngestError as exc:
            return _ingest_failed(env, str(exc))
        supervisor = Supervisor(
            procs,
            terminator(env.environ, plans),
            stop_grace=env.stop_grace,
            preempt_grace=env.preempt_grace,
            notice=lambda kind, kill_at: write_notice(env.notice_file, kind, kill_at),
            spared=spared,
        )
        supervisor.install()
        checkpoints = CheckpointWatcher(client, env.attempt, env.checkpoint_dir)
        started_at = _write_started(env, plans, procs)
        report_started(client, env.attempt)
        shipper.start()
        metrics.shipper.start()
        metrics.start()
        checkpoints.start()
        samplers = _start_samplers(plans, procs, metrics, counts)
        reporter = _start_reporter(client, env, plans, procs, counts)
        own = env.own_rank  # a pod of a multi-node job: its lines are its rank's
        sink = CountingLineSink(
            console, shipper, ranked=multi or own is not None, marked=multi, counts=counts
        )
        boards = _follow_tensorboard(env, plans[0].env, metrics, sink, began, sandbox)
        readers = _read_output(env, plans, procs, sink)
        codes, failed = wait_ranks(procs, supervisor)
        for sampler in samplers:
            sampler.stop()  # no samples of a finished job; before the final flush and exit file
        reporter.stop()
        supervisor.end_leftovers(readers)
        boards.stop()  # what the job wrote last, told in its log while that is still open
    if sandbox is not None:
        sandbox.close()  # after the last read of its private /tmp; the exit record says so
    metrics.stop()
    checkpoints.stop()  # the checkpoint a preempted job saved on its notice, reported now
    _flush(shipper, metrics.shipper)
    if not multi:
        return _finish(env, codes[0], started_at)
    return _finish_ranks(env, plans, codes, failed, supervisor.signalled, started_at)


def start_ranks(
    env: RunnerEnv, plans: list[RankPlan], sandbox: Sandbox | None
) -> list[subprocess.Popen]:
    """Every rank started, or none left running: a rank that cannot start ends those started
    before it and is an ingest failure (the job's code did not run as asked)."""
    procs: list[subprocess.Popen] = []
    for plan in plans:
        try:
            procs.append(start_rank(env, plan, sandbox))
        except OSError as exc:
            spared = sandbox.helpers if sandbox is not None else None
            Supervisor(procs, spared=spared).end_all()
            for proc in procs:
                proc.wait()
            raise IngestError(f"cannot start entrypoint {plan.argv[0]!r}: {exc}") from exc
    return procs


def _write_started(env: RunnerEnv, plans: list[RankPlan], procs: list[subprocess.Popen]) -> float:
    """started.json, signed: when, the first rank's process group, and every rank's."""
    started_at = time.time()
    started: dict[str, Any] = {"started_at": started_at, "pid": procs[0].pid}
    if len(plans) > 1:
        started["pids"] = [proc.pid for proc in procs]
        started["ranks"] = [
            {"rank": p.index, "node": p.node, "state": "running", "exit_code": None} for p in plans
        ]
    write_record(env.started_file, started, env.record_key)
    return started_at


def _start_samplers(
    plans: list[RankPlan],
    procs: list[subprocess.Popen],
    metrics: MetricsTail,
    counts: ActivityCounts,
) -> list[SystemSampler]:
    # start_new_session=True: each rank's pid is its process group's id. An srun step's
    # processes run under slurmstepd, not here: nothing of theirs to sample on this host.
    multi = len(plans) > 1
    samplers = [
        SystemSampler(
            proc.pid,
            metrics.add,
            sample_interval(plan.env),
            plan.env.get("CUDA_VISIBLE_DEVICES"),
            prefix=f"rank{plan.index}/" if multi else "",
            observe=functools.partial(counts.sampled, plan.index),
        )
        for plan, proc in zip(plans, procs, strict=True)
        if plan.argv[:1] != ["srun"]
    ]
    for sampler in samplers:
        sampler.start()
    return samplers


def _start_reporter(
    client: Client | None,
    env: RunnerEnv,
    plans: list[RankPlan],
    procs: list[subprocess.Popen],
    counts: ActivityCounts,
) -> ActivityReporter:
    """The activity reports (`sf.activity`), one per sample period; the process groups it may
    dump are the ranks started here (an srun step's run under slurmstepd)."""
    groups = {
        plan.index: proc.pid
        for plan, proc in zip(plans, procs, strict=True)
        if plan.argv[:1] != ["srun"]
    }
    interval = sample_interval(plans[0].env)
    ranks = [plan.index for plan in plans]
    reporter = ActivityReporter(client, env.attempt, counts, interval, groups, ranks)
    reporter.start()
    return reporter


def _follow_tensorboard(
    env: RunnerEnv,
    job_env: dict[str, str],
    metrics: MetricsTail,
    sink: LineSink,
    began: float,
    sandbox: Sandbox | None,
) -> TensorBoardTail:
    """The job's TensorBoard scalars into its metrics, numbered with the SDK's points; what a
    file's problem is goes to the job's own log. In a sandbox its files are read as its anchor
    sees them (its private /tmp too), so the tail stops before the sandbox closes."""
    folders = tensorboard_roots(env.output_dir, env.run_dir, job_env)
    owner = env.identity.uid if env.identity else None
    tail = TensorBoardTail(
        folders,
        metrics.add,
        began,
        owner,
        tell=lambda text: sink.emit("stderr", f"sf: {text}"),
        anchor=sandbox.anchor if sandbox is not None else None,
    )
    tail.start()
    return tail


def _read_output(
    env: RunnerEnv, plans: list[RankPlan], procs: list[subprocess.Popen], sink: LineSink
) -> list[threading.Thread]:
    """A reader thread per stream of every rank, each line into `sink` with its rank."""
    multi = len(plans) > 1
    readers = []
    for plan, proc in zip(plans, procs, strict=True):
        rank = plan.index if multi else env.own_rank
        for pipe, stream in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            reader = threading.Thread(target=pump, args=(pipe, stream, sink, rank), daemon=True)
            reader.start()
            readers.append(reader)
    return readers


def _flush(*channels: BatchShipper) -> None:
    # Every channel flushes at once: a down server costs the give-up time once, not per channel.
    for channel in channels:
        channel.begin_close()
    for channel in channels:
        channel.join()


# How often the runner looks at its ranks, and so the longest a stop or a preemption notice
# waits for its handler: Python runs signal handlers in the main thread, and a signal the
# kernel hands to another of the runner's threads (the readers, samplers, shippers) does not
# interrupt a main thread blocked in waitpid. Waiting without a timeout would act on that
# notice only once the job exited by itself.
RANK_POLL_S = 0.05


def wait_ranks(
    procs: list[subprocess.Popen], supervisor: Supervisor
) -> tuple[list[int], int | None]:
    """Wait for every rank; the first to exit non-zero fails the attempt and every other rank
    is ended at once (SIGTERM, SIGKILL after the grace). Returns the exit codes and the index
    of the rank that failed first (None: none failed). A single-node job is one rank, the job
    itself: what it leaves running is ended once it exits (`Supervisor.end_leftovers`)."""
    codes: list[int | None] = [None] * len(procs)
    failed = None
    while True:
        for index, proc in enumerate(procs):
            if codes[index] is None:
                code = proc.poll()
                if code is None:
                    continue
                codes[index] = code
                if code != 0 and failed is None:
                    failed = index
                    if len(procs) > 1:
                        supervisor.end_all()
        if all(code is not None for code in codes):
            return [c if c is not None else 0 for c in codes], failed
        time.sleep(RANK_POLL_S)


def _finish_ranks(
    env: RunnerEnv,
    plans: list[RankPlan],
    codes: list[int],
    failed: int | None,
    stopped: bool,
    started_at: float,
) -> int:
    states = rank_states(list(codes), failed, stopped)
    ranks = [
        {"rank": p.index, "node": p.node, "state": state, "exit_code": code}
        for p, code, state in zip(plans, codes, states, strict=True)
    ]
    code, reason = 0, ""
    if failed is not None:
        code = codes[failed]
        plan = plans[failed]
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        reason = f"rank {plan.index} on {plan.node} {how}"
        if not stopped:
            reason += "; every other rank was ended"
    record = {
        "exit_code": code,
        "reason": reason,
        "started_at": started_at,
        "ranks": ranks,
        "failed_rank": None if stopped else failed,
    }
    write_record(env.exit_file, {**record, "ended_at": time.time()}, env.record_key)
    return exit_status(code)


def _finish(env: RunnerEnv, code: int, started_at: float | None) -> int:
    reason = f"killed by signal {-code}" if code < 0 else ""
    record = {"exit_code": code, "reason": reason, "started_at": started_at}
    write_record(env.exit_file, {**record, "ended_at": time.time()}, env.record_key)
    return exit_status(code)


def _ingest_failed(env: RunnerEnv, why: str) -> int:
    reason = f"{INGEST_FAILED}: {why}"
    say(reason)
    record = {"exit_code": None, "reason": reason, "started_at": None}
    write_record(env.exit_file, {**record, "ended_at": time.time()}, env.record_key)
    return INGEST_EXIT


def write_json_atomic(path: str, data: dict) -> None:
    """Write JSON via tmp + rename so executors never read a half-written file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_record(path: str, record: dict, key: str) -> None:
    """A runner record, signed when the executor gave a record key."""
    write_json_atomic(path, {**record, "mac": record_mac(key, record)} if key else record)


def record_process(path: str) -> None:
    """Write this runner's pid where the executor asked for it.

    The local executor also writes it after spawning us; writing it here first closes the gap
    in which a worker crash would leave a live runner that nobody could signal.
    """
    write_json_atomic(path, {"pid": os.getpid()})


def take_back_priority(raw: str | None) -> None:
    """Run at the niceness the executor names (NICENESS_VAR) if it is higher than this
    process's: a worker that lowered its own priority to leave the CPU to web requests must not
    pass that on to the job. Raising priority needs root or CAP_SYS_NICE; without them the job
    runs at the worker's, which the runner's log says."""
    if not raw:
        return
    try:
        wanted = int(raw)
    except ValueError:
        say(f"ignoring {NICENESS_VAR}={raw!r}: not an integer")
        return
    now = os.getpriority(os.PRIO_PROCESS, 0)
    if wanted >= now:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, wanted)
    except PermissionError:
        say(f"the job runs at niceness {now}: raising it to {wanted} needs CAP_SYS_NICE")


def main() -> int:
    """Run one attempt of a job as described by the SF_* environment."""
    # First of all: a job of our uid may not read our environ (credentials) or ptrace us, and
    # whatever it forks stays below us, however it detaches.
    guard_runner()
    take_back_priority(os.environ.get(NICENESS_VAR))
    if os.environ.get(RUN_AS_UID_VAR):
        os.umask(0o077)  # a root runner's files (console.log, records) are its own
    if os.environ.get(PROC_FILE_VAR):
        record_process(os.environ[PROC_FILE_VAR])
    env = RunnerEnv(dict(os.environ))
    # Until the child exists there is nothing to forward to: a stop must still leave an exit file.
    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGINT, _raise_terminated)
    signal.signal(signal.SIGUSR1, _raise_terminated)  # a preemption notice: nothing to save
    try:
        argv, child = prepare(env)
        plans = plan_ranks(env.environ, argv, child, env.run_dir)
    except (IngestError, RankPlanError) as exc:
        return _ingest_failed(env, str(exc))
    except Terminated as exc:
        say(f"stopped by signal {exc.signum} before the entrypoint started")
        return _finish(env, -exc.signum, None)
    return run(env, plans)


if __name__ == "__main__":
    sys.exit(main())
