"""Why a job is where it is, in sentences computed from the ledger (the Diagnostics tab)."""

import datetime as dt

from django.conf import settings
from django.utils import timezone
from sf.contract import Failure

from jobs.durations import say
from jobs.executors.base import preempt_grace_s
from jobs.models import Attempt, Job, JobEvent
from jobs.reads import activity
from jobs.reads.preemption import paused_by_preemption
from jobs.reads.queue import queue_places, queue_row
from jobs.reads.visible import current_attempt, retry_unavailable_reason
from jobs.states import JobStatus
from jobs.stores import logstore
from metering.usage import attempt_gpu_seconds

S = JobStatus


def explain(job: Job, now: dt.datetime | None = None) -> list[str]:
    now = now or timezone.now()
    attempt = current_attempt(job)
    sentences = _by_status(job, attempt, now) + _ranks(job, attempt) + _cluster_health(job, now)
    sentences += _preemption(job, attempt, now)
    sentences += activity.diagnosis(job.pk, attempt.pk if attempt else None, _billed(attempt, now))
    if job.status in (S.FAILED, S.STOPPED):
        why_not = retry_unavailable_reason(job)
        sentences.append(
            f"Retry is not possible: {why_not}."
            if why_not
            else "`sf job retry` puts it back on the queue under the same run_id."
        )
    unmapped = (
        JobEvent.objects.filter(
            job=job, kind=JobEvent.Kind.OBSERVATION, data__native_state__isnull=False
        )
        .values_list("data__native_state", flat=True)
        .distinct()
    )
    for state in unmapped:
        sentences.append(
            f"The backend reported a state Starforge does not map: {state!r}; "
            "it did not change the job's status."
        )
    return sentences


def _billed(attempt: Attempt | None, now: dt.datetime) -> float:
    if attempt is None or attempt.start_time is None:
        return 0.0
    return attempt_gpu_seconds(attempt.start_time, attempt.end_time, attempt.total_gpus, now)


def _preemption(job: Job, attempt: Attempt | None, now: dt.datetime) -> list[str]:
    """Borrowed GPUs: that the job holds some and may be preempted, that it is being
    preempted, or that its last preemption paused it and how it resumes. The lender is
    another team, so it is never named: its members' jobs are theirs to know."""
    sentences = []
    if job.status in S.active() and attempt is not None and attempt.borrowed_from_id:
        if attempt.preempted_at is not None:
            grace = preempt_grace_s(job.cluster.settings)
            kill = attempt.preempted_at + dt.timedelta(seconds=grace)
            sentences.append(
                f"Preempted at {attempt.preempted_at:%H:%M:%S} UTC: the lending team needs "
                f"back the GPUs this job borrowed. It was sent SIGTERM and its notice "
                f"(sf.should_checkpoint() is true) and is killed at {kill:%H:%M:%S} UTC unless "
                "it exits first; it then goes PAUSED and is queued again to resume from its "
                f"checkpoint{_checkpoint(attempt)}."
            )
        else:
            floor = settings.SF_PREEMPT_MIN_RUNTIME_S
            after = (
                f" once it has run {say(floor)} (from "
                f"{attempt.start_time + dt.timedelta(seconds=floor):%H:%M:%S} UTC)"
                if attempt.start_time
                else f" once it has run {say(floor)}"
            )
            sentences.append(
                f"It runs on GPUs borrowed from another team's idle quota, beyond its own "
                f"team's: it is preemptible while it holds them{after}, when that team "
                f"wants them back{_checkpoint(attempt)}."
            )
    last = (
        Attempt.objects.filter(job=job, preempted_at__isnull=False, end_time__isnull=False)
        .order_by("-number")
        .first()
    )
    if last is not None and job.status in (S.PAUSED, S.QUEUED, *S.active()):
        end = last.end_time or now
        ran = say((end - last.start_time).total_seconds()) if last.start_time else "0 s"
        if paused_by_preemption(job, attempt):
            then = "the scheduler queues it again on its next tick"
        elif job.status == S.PAUSED:
            then = "it stays PAUSED until it is resumed (someone paused it since)"
        elif job.status == S.QUEUED:
            then = "it is queued again and resumes from its checkpoint when it can run"
        else:
            then = f"attempt {job.attempt_count} resumed it from its checkpoint"
        sentences.append(
            f"Attempt {last.number} was preempted at {last.preempted_at:%H:%M:%S} UTC: the "
            f"lending team took back the {last.total_gpus} GPUs it had borrowed. It ran {ran} "
            f"(billed as run) and ended at {end:%H:%M:%S} UTC{_checkpoint(last)}; {then}. "
            "A resume after a preemption spends no retry."
        )
    return sentences


def _checkpoint(attempt: Attempt) -> str:
    if attempt.checkpoint_at is None:
        return " (no checkpoint of its seen yet)"
    return f" (its newest checkpoint: {attempt.checkpoint_at:%H:%M:%S} UTC)"


def _by_status(job: Job, attempt: Attempt | None, now: dt.datetime) -> list[str]:
    status = job.status
    if status == S.QUEUED:
        return [
            f"Waiting to be admitted: {job.status_reason}.",
            *_queue_place(job),
            "Quota and the schedule window are checked before cluster capacity.",
        ]
    if status == S.SUBMITTED:
        since = (now - job.status_changed_at).total_seconds()
        text = (
            f"Quota reserved; attempt {job.attempt_count} is being launched on "
            f"{job.cluster.name} ({since:.0f} s so far)."
        )
        if since > settings.SF_LAUNCH_STUCK_S:
            text += (
                " The launch was not recorded in time: the reconciler adopts the backend "
                "object of the same name or launches it once."
            )
        return [text]
    if status == S.PENDING and attempt is not None:
        return _pending(job, attempt, now)
    if status == S.RUNNING and attempt is not None and attempt.start_time:
        used = attempt_gpu_seconds(attempt.start_time, None, attempt.total_gpus, now)
        return [
            f"Running since {attempt.start_time:%Y-%m-%d %H:%M:%S} UTC on {_gpus(job)} "
            f"of {job.cluster.name} as {attempt.job_ref}; {used:.0f} GPU-seconds so far.",
            _time_limit(job, attempt.start_time, now),
        ]
    if status == S.FAILED and attempt is not None:
        return _failed(job, attempt)
    if status == S.SUCCEEDED:
        children = list(job.follow_ons.values_list("follow_on_name", "pk"))
        made = ", ".join(f"{name} (job {pk})" for name, pk in children)
        return ["Exited with code 0."] + ([f"Follow-on jobs: {made}."] if made else [])
    return [f"{status.title()}: {job.status_reason}."]


def _queue_place(job: Job) -> list[str]:
    """Where the last scheduler tick placed the job, and when it can start."""
    place = queue_places([queue_row(job)], staff=False)[job.pk]
    if place["queue_position"] is None:
        return [f"Queue position: {place['estimate_reason']}."]
    cluster, team = job.cluster.name, job.team.name
    text = (
        f"Position {place['queue_position']} among the jobs waiting on cluster {cluster} "
        f"(number {place['team_queue_position']} of team {team}'s)"
    )
    if place["ahead_jobs"]:
        nearest = ", ".join(
            f"job {a['id']} ({_n(a['total_gpus'], 'GPU')})"
            if a["id"] is not None
            else f"another team's job ({_n(a['total_gpus'], 'GPU')})"
            for a in place["ahead"]
        )
        text += (
            f"; ahead of it: {_n(place['ahead_jobs'], 'job')} asking for "
            f"{_n(place['ahead_gpus'], 'GPU')}, the nearest {nearest}"
        )
    sentences = [text + "."]
    start = place["estimated_start"]
    if start is not None:
        sentences.append(
            f"Estimated start: by {start:%Y-%m-%d %H:%M:%S} UTC, if the running jobs run to "
            "their time limits and nothing is submitted ahead of it."
        )
    else:
        sentences.append(f"No start estimate: {place['estimate_reason']}.")
    return sentences


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _time_limit(job: Job, start: dt.datetime, now: dt.datetime) -> str:
    if not job.time_limit_s:
        return "No time limit: it runs until it ends or is stopped."
    end = start + dt.timedelta(seconds=job.time_limit_s)
    left = (end - now).total_seconds()
    when = f"at {end:%Y-%m-%d %H:%M:%S} UTC"
    if left <= 0:
        return f"Its time limit of {say(job.time_limit_s)} passed {when}; it is being stopped."
    return (
        f"Its time limit of {say(job.time_limit_s)} stops it {when} ({say(left)} from now) "
        "unless it ends before; a time-limit stop is not retried automatically."
    )


def _gpus(job: Job) -> str:
    """What the job holds, in words: "2 GPU(s)", or "8 GPUs (2 nodes x 4 a100)"."""
    if job.nodes < 2:
        return f"{job.total_gpus} GPU(s)" + (f" ({job.gpu_type})" if job.gpu_type else "")
    kind = f" {job.gpu_type}" if job.gpu_type else ""
    return f"{job.total_gpus} GPUs ({job.nodes} nodes x {job.gpus_per_node}{kind})"


def _ranks(job: Job, attempt: Attempt | None) -> list[str]:
    """One sentence per rank of a multi-node attempt, as the engine last reported it."""
    if attempt is None or attempt.nodes < 2:
        return []
    if not attempt.ranks:
        return [f"Its {attempt.nodes} ranks have not been reported by the engine yet."]
    sentences = []
    for rank in attempt.ranks:
        code = "" if rank["exit_code"] is None else f", exit code {rank['exit_code']}"
        sentences.append(f"Rank {rank['rank']} on {rank['node']}: {rank['state']}{code}.")
    return sentences


def _pending(job: Job, attempt: Attempt, now: dt.datetime) -> list[str]:
    deadline = job.pending_deadline_s or settings.SF_PENDING_DEADLINE_S
    since = attempt.pending_at or attempt.submitted_at
    left = deadline - (now - since).total_seconds()
    native = f" (backend state {attempt.native_state})" if attempt.native_state else ""
    waiting = (
        [f"The backend says why it waits: {attempt.native_message}."]
        if attempt.native_message
        else []
    )
    return [
        f"On cluster {job.cluster.name} as {attempt.job_ref}, not running yet{native}.",
        *waiting,
        f"It fails with a pending deadline in {max(left, 0):.0f} s unless it starts "
        f"(deadline {deadline} s).",
    ]


def _cluster_health(job: Job, now: dt.datetime) -> list[str]:
    """What is wrong with the job's cluster, when the job still depends on it."""
    if job.status not in S.active() | {S.QUEUED}:
        return []
    cluster, sentences = job.cluster, []
    if cluster.unreachable_since:
        minutes = (now - cluster.unreachable_since).total_seconds() / 60
        sentences.append(
            f"Cluster {cluster.name} cannot be reached (for {minutes:.0f} min): "
            f"{cluster.unreachable_reason}. Nothing is admitted to it until it answers."
        )
    if cluster.poll_failing_since and job.status in S.active():
        minutes = (now - cluster.poll_failing_since).total_seconds() / 60
        sentences.append(
            f"Polling cluster {cluster.name} fails (for {minutes:.0f} min): {cluster.poll_error}. "
            "The job's status here is the last one observed; it is not declared lost while "
            "the cluster cannot be asked."
        )
    return sentences


def _failed(job: Job, attempt: Attempt) -> list[str]:
    causes: dict[str, str] = {
        Failure.EXIT: f"the entrypoint exited with code {attempt.exit_code}",
        Failure.OOM: "the process ran out of memory",
        Failure.LOST: "the backend lost the job",
        Failure.PREEMPTED: "the backend preempted the job",
        Failure.INGEST: "the snapshot could not be fetched or unpacked (the code never ran)",
        Failure.DEADLINE: "it stayed PENDING past its deadline",
        Failure.REJECTED: "the backend rejected the launch",
    }
    cause = causes.get(attempt.failure, attempt.end_reason.split(";")[0] or "unknown")
    sentences = [f"Attempt {attempt.number} failed: {cause}."]
    tail = logstore.tail_text(job.pk, attempt.number, 5)
    if tail:
        sentences.append("Last lines:\n" + tail)
    if job.next_attempt_at:
        sentences.append(
            f"Automatic retry {job.retry_count + 1} of {job.max_retries} starts "
            f"at {job.next_attempt_at:%H:%M:%S} UTC."
        )
    return sentences
