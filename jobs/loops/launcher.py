"""Launching attempts: SUBMITTED → claim → executor submit → PENDING with job_ref.

At most once per attempt (docs/ARCHITECTURE.md, invariant 4), from workers on any hosts, with
nothing shared between them but the ledger: a launcher first claims its attempts (`_claim`: one
short transaction that locks the rows, skips those another launcher is claiming, and stamps
`launch_claimed_at`), and only the claimer calls the engine. A claim older than the lease
(SF_LAUNCH_CLAIM_S) is a dead launcher's, perhaps one that died between the engine's answer and
recording it: the next launcher (a redelivered task, the reconciler's launch repair) takes it
over and first asks the engine for an object of the attempt's deterministic name, adopting it
rather than submitting a second one. A launcher that cannot reach the engine well within its
own claim (a sick engine queueing its calls) gives the attempt back unlaunched instead of
racing the launcher that might take it over.

The claimed attempts are launched LAUNCH_THREADS at a time, so a batch takes about as long as
its slowest engine calls, not their sum. The pool's threads only talk to the engine; this
thread records their outcomes as they come (every RECORD_EVERY, or after RECORD_AFTER_S), so a
job launched early in a long batch shows PENDING, and gets polled, within a second.

`launch_attempts` is safe to run twice for the same attempts (a duplicated Celery delivery, a
second beat, the reconciler repairing a crash mid-launch): an attempt that already has a
job_ref, whose job moved on, or that another launcher holds, is skipped.
"""

import datetime as dt
import json
import logging
import posixpath
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from sf.contract import (
    API_URL_VAR,
    ARRAY_ID_VAR,
    ARRAY_INDEX_VAR,
    ARRAY_PARAMS_VAR,
    ATTEMPT_VAR,
    CHECKPOINT_DIR_VAR,
    ENTRYPOINT_VAR,
    JOB_ID_VAR,
    OUTPUT_DIR_VAR,
    PARENT_OUTPUT_DIR_VAR,
    PARENT_RUN_ID_VAR,
    PREEMPT_GRACE_VAR,
    RUN_ID_VAR,
    SNAPSHOT_VAR,
    STOP_GRACE_VAR,
    USER_ENV_VAR,
    Failure,
)

from jobs.executors import LaunchError, LaunchSpec, executor_for
from jobs.executors.base import executor_class, preempt_grace_s
from jobs.job_tokens import runner_credentials
from jobs.ledger.batches import write_batches
from jobs.ledger.ends import READ_FIELDS, end_decided
from jobs.ledger.halt import cancel_attempt
from jobs.ledger.transitions import Change, TransitionRefused, apply_transitions
from jobs.models import Attempt, Job, run_output_dir
from jobs.states import JobStatus

log = logging.getLogger(__name__)
LAUNCH_THREADS = 16
RECORD_EVERY = 25
RECORD_AFTER_S = 0.5


@dataclass(frozen=True)
class LaunchOutcome:
    attempt_id: int
    job_ref: str = ""
    error: str = ""
    permanent: bool = False
    late: bool = False  # the engine was not called within the claim: given back, unlaunched


def launch_attempts(attempt_ids: list[int]) -> list[LaunchOutcome]:
    claimed_at, claimed = _claim(attempt_ids)
    if not claimed:
        return []
    call_by = time.monotonic() + settings.SF_LAUNCH_CLAIM_S / 2
    outcomes: list[LaunchOutcome] = []
    unrecorded: list[LaunchOutcome] = []
    running: set[Future[LaunchOutcome]] = set()
    since = time.monotonic()
    with ThreadPoolExecutor(min(LAUNCH_THREADS, len(claimed)), "launch") as pool:
        for attempt in claimed:
            try:
                spec = launch_spec(attempt.job, attempt)
            except Exception as exc:  # noqa: BLE001 - one bad attempt never stops the batch
                unrecorded.append(_failure(attempt, exc))
                continue
            running.add(pool.submit(_on_pool_thread, attempt, spec, call_by))
        while running:
            done, running = wait(running, timeout=RECORD_AFTER_S, return_when=FIRST_COMPLETED)
            unrecorded += [future.result() for future in done]
            if len(unrecorded) >= RECORD_EVERY or time.monotonic() - since > RECORD_AFTER_S:
                _record(unrecorded)
                outcomes += unrecorded
                unrecorded, since = [], time.monotonic()
    _record(unrecorded)
    outcomes += unrecorded
    # Fresh ones that never reached the engine: the next launcher may take them as fresh
    # (unless one took them over meanwhile). One taken over stays claimed until its lease ends.
    fresh = {a.pk for a in claimed if a.launch_claimed_at is None}
    late = [o.attempt_id for o in outcomes if o.late and o.attempt_id in fresh]
    Attempt.objects.filter(pk__in=late, launch_claimed_at=claimed_at).update(launch_claimed_at=None)
    return outcomes


def _claim(attempt_ids: list[int]) -> tuple[dt.datetime, list[Attempt]]:
    """The attempts this launcher may launch, claimed: still wanted, not launched, and not
    held by a live claimer. Each keeps the claim it had before in `launch_claimed_at` (None:
    no engine was ever asked to launch it)."""
    now = timezone.now()
    expired = now - dt.timedelta(seconds=settings.SF_LAUNCH_CLAIM_S)
    with transaction.atomic():
        # Only what the claim decides on is read in its transaction, which on the embedded
        # ledger holds the write lock every submit waits for; the rest is loaded after.
        before = dict(
            Attempt.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(pk__in=attempt_ids, job_ref="", end_time__isnull=True)
            .filter(job__status=JobStatus.SUBMITTED, job__current_attempt=F("pk"))
            .filter(Q(launch_claimed_at__isnull=True) | Q(launch_claimed_at__lt=expired))
            .values_list("pk", "launch_claimed_at")
        )
        Attempt.objects.filter(pk__in=before.keys()).update(launch_claimed_at=now)
    attempts = list(
        Attempt.objects.filter(pk__in=before.keys())
        .select_related("job", "job__cluster", "job__team")
        .order_by("pk")
    )
    for attempt in attempts:
        attempt.launch_claimed_at = before[attempt.pk]  # the claim it had before this one
    return now, attempts


def _on_pool_thread(attempt: Attempt, spec: LaunchSpec, call_by: float) -> LaunchOutcome:
    try:
        return _launch_one(attempt, spec, call_by)
    finally:
        connection.close()  # this thread's own, should an executor ever open one


def _launch_one(attempt: Attempt, spec: LaunchSpec, call_by: float) -> LaunchOutcome:
    """One engine call (two for a claim taken over)."""
    try:
        if time.monotonic() > call_by:
            return LaunchOutcome(attempt.pk, late=True)
        executor = executor_for(attempt.job.cluster)
        taken_over = attempt.launch_claimed_at is not None
        ref = (executor.find(spec.name) if taken_over else None) or executor.submit(spec)
        return LaunchOutcome(attempt.pk, job_ref=ref)
    except Exception as exc:  # noqa: BLE001 - recorded as the attempt's launch failure
        return _failure(attempt, exc)


def _failure(attempt: Attempt, exc: Exception) -> LaunchOutcome:
    if isinstance(exc, LaunchError):
        return LaunchOutcome(attempt.pk, error=str(exc), permanent=exc.permanent)
    # an executor bug or an unreachable engine: try again later
    log.error("launch of %s failed", attempt.backend_name, exc_info=exc)
    return LaunchOutcome(attempt.pk, error=f"{type(exc).__name__}: {exc}")


def _record(outcomes: list[LaunchOutcome]) -> None:
    if not outcomes:
        return
    launched = [o for o in outcomes if o.job_ref]
    now = timezone.now()
    # An attempt's job never changes: read before the transaction, which on the embedded
    # ledger holds the write lock every submit waits for.
    by_attempt = dict(
        Attempt.objects.filter(pk__in=[o.attempt_id for o in outcomes]).values_list("pk", "job_id")
    )
    refused: list[TransitionRefused] = []
    for batch in write_batches(launched):
        with transaction.atomic():
            _set_job_refs(batch, now)
            # One shared reason keeps the status update a single statement for the whole
            # batch; each job's backend handle goes into its event's data.
            changes = [
                Change(
                    by_attempt[o.attempt_id], "launched on the backend", data={"job_ref": o.job_ref}
                )
                for o in batch
            ]
            refused += apply_transitions(
                JobStatus.PENDING, changes, actor="launcher", expected={JobStatus.SUBMITTED}
            )[1]
    if refused:
        for attempt_id in _unwanted(launched, {r.job_id for r in refused}):
            transaction.on_commit(partial(cancel_attempt, attempt_id))
    for outcome in outcomes:
        if outcome.error:
            _launch_failed(by_attempt[outcome.attempt_id], outcome)


def _set_job_refs(launched: list[LaunchOutcome], now: dt.datetime) -> None:
    """Each launched attempt's job_ref and pending_at, in one UPDATE.

    Plain SQL because `bulk_update` resolves a Case/When expression per row and field, which
    costs more than the launches themselves on a fast backend (a batch is recorded every
    `RECORD_EVERY` launches).
    """
    if not launched:
        return
    table = connection.ops.quote_name(Attempt._meta.db_table)
    pk = connection.ops.quote_name(Attempt._meta.pk.attname)
    whens = " ".join(["WHEN %s THEN %s"] * len(launched))
    ids = ", ".join(["%s"] * len(launched))
    refs = [value for o in launched for value in (o.attempt_id, o.job_ref)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET pending_at = %s, job_ref = CASE {pk} {whens} END "
            f"WHERE {pk} IN ({ids})",
            [
                connection.ops.adapt_datetimefield_value(now),
                *refs,
                *(o.attempt_id for o in launched),
            ],
        )


def _launch_failed(job_id: int, outcome: LaunchOutcome) -> None:
    """The attempt ends with its launch: FAILED and not retried for a permanent error, back to
    QUEUED for a transient one (`jobs.ledger.ends`)."""
    target = JobStatus.FAILED if outcome.permanent else JobStatus.QUEUED
    word = "launch failed" if outcome.permanent else "launch failed, will retry"
    with transaction.atomic():
        job = Job.objects.select_for_update().only(*READ_FIELDS).get(pk=job_id)
        if job.current_attempt_id != outcome.attempt_id:  # readmitted since: a new attempt
            log.info("launch failure of job %s not recorded: it moved on", job_id)
            return
        _, refused = end_decided(
            [job],
            target,
            f"{word}: {outcome.error}",
            actor="launcher",
            now=timezone.now(),
            expected={JobStatus.SUBMITTED},
            failure=Failure.REJECTED,
        )
    if refused:  # stopped or paused meanwhile: nothing to record
        log.info("launch failure of job %s not recorded: %s", job_id, refused[0])


def _unwanted(launched: list[LaunchOutcome], refused_jobs: set[int]) -> list[int]:
    """Launched attempts whose job moved on meanwhile (stopped, paused): take them back.

    An attempt that is still its job's current one in an active state was recorded by
    someone else (the reconciler adopting it after a worker crash): it stays.
    """
    attempts = Attempt.objects.filter(
        pk__in=[o.attempt_id for o in launched], job_id__in=refused_jobs
    ).select_related("job")
    return [
        a.pk
        for a in attempts
        if a.job.current_attempt_id != a.pk or a.job.status not in JobStatus.active()
    ]


def launch_spec(job: Job, attempt: Attempt) -> LaunchSpec:
    # A cluster whose jobs see the server or the run outputs under other names says so in
    # its settings (a pod reaches the API through a service URL, not 127.0.0.1).
    cluster_settings = job.cluster.settings
    output_root = cluster_settings.get("output_root")
    output_dir = run_output_dir(output_root, job.run_id)
    user_env = {str(k): str(v) for k, v in job.env.items()}
    grace = preempt_grace_s(cluster_settings)
    env = {
        **user_env,
        API_URL_VAR: cluster_settings.get("api_url") or settings.SF_API_URL,
        JOB_ID_VAR: str(job.pk),
        RUN_ID_VAR: job.run_id,
        ATTEMPT_VAR: str(attempt.number),
        OUTPUT_DIR_VAR: output_dir,
        CHECKPOINT_DIR_VAR: posixpath.join(output_dir, "checkpoints"),
        ENTRYPOINT_VAR: json.dumps(job.entrypoint),
        SNAPSHOT_VAR: job.snapshot_id or "",
        # The job's own variables apart, so a runner that runs as another user than the job
        # (the local executor's run_as) applies them to the job alone, never to itself.
        USER_ENV_VAR: json.dumps(user_env),
        PREEMPT_GRACE_VAR: str(grace),
        **runner_credentials(job.cluster.kind, attempt),
    }
    if executor_class(job.cluster.kind).PREEMPT_BY_TERM:
        env[STOP_GRACE_VAR] = str(grace)  # a SIGTERM there may be a preemption's notice
    if job.array_id:  # a task of an array: which one, and its parameters
        env[ARRAY_ID_VAR] = str(job.array_id)
        env[ARRAY_INDEX_VAR] = str(job.array_index)
        env[ARRAY_PARAMS_VAR] = json.dumps(job.array_params or {})
    if job.parent_id:  # a follow-on job reads its parent's outputs
        parent_run = Job.objects.values_list("run_id", flat=True).get(pk=job.parent_id)
        env[PARENT_RUN_ID_VAR] = parent_run
        env[PARENT_OUTPUT_DIR_VAR] = run_output_dir(output_root, parent_run)
    return LaunchSpec(
        name=attempt.backend_name,
        job_id=job.pk,
        run_id=job.run_id,
        attempt=attempt.number,
        total_gpus=attempt.total_gpus,
        entrypoint=list(job.entrypoint),
        env=env,
        team=job.team.name,
        team_id=job.team_id,
        nodes=attempt.nodes,
        gpu_type=job.gpu_type,
        cpus=job.cpus,
        memory_mb=job.memory_mb,
        image=job.image,
        time_limit_s=job.time_limit_s,
        pending_deadline_s=job.pending_deadline_s or settings.SF_PENDING_DEADLINE_S,
        avoid_nodes=tuple(job.avoid_nodes),
    )
