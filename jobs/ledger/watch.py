"""The activity watch's writes: the idle warning, the idle notice and its pause or stop, and
the suspected hang with its stack dumps and the hang action.

Each step is written once per idle or stalled spell: a guarded update of the attempt's
activity row (`WHERE <step> IS NULL OR <step> < spell`) claims it, so two ticks never both
write it, and the event, the webhook deliveries (`jobs.ledger.outbox.on_watch`) and what
follows go in the same transaction. A pause or stop goes through `jobs.ledger.halt` (whose
cancel, after commit, is the runner's notice: the notice file, SIGTERM, SIGKILL after the
grace); a hang's fail through `jobs.ledger.ends` with cause `hung` (retried per the job's
budget), its engine told to cancel after commit. Where the engine can keep an attempt off nodes
(Slurm), the nodes the hung attempt ran on join the job's `avoid_nodes`, which its later
attempts keep off (`_keep_off_hung_nodes`). The job's dumps are its own text: kept in the
event's data, bounded by the ingest route, escaped wherever shown.
"""

import datetime as dt

from django.db import transaction
from django.db.models import Q
from sf.contract import Failure

from jobs.durations import say
from jobs.executors.base import executor_class
from jobs.ledger import ends, outbox
from jobs.ledger.halt import cancel_attempt, halt
from jobs.models import Attempt, AttemptActivity, Cluster, Job, JobEvent, Webhook
from jobs.reads.activity import Watched, idle_since, moving_ranks, stalled_since
from jobs.states import JobStatus

S = JobStatus
IDLE_ACTOR = "idle policy"
HANG_ACTOR = "hang policy"


def _claim(w: Watched, field: str, spell: dt.datetime, now: dt.datetime) -> bool:
    """Mark `field` at `now` on the attempt's activity, once per spell; True when this call
    did (a runner that never reported has no row yet: it gets one)."""
    AttemptActivity.objects.get_or_create(
        attempt_id=w.attempt_id, defaults={"busy_at": w.start, "moved_at": w.start}
    )
    return bool(
        AttemptActivity.objects.filter(attempt_id=w.attempt_id)
        .filter(Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__lt": spell}))
        .update(**{field: now})
    )


def _event(w: Watched, reason: str, actor: str, now: dt.datetime, **data: object) -> None:
    JobEvent.objects.create(
        job_id=w.job_id,
        time=now,
        kind=JobEvent.Kind.OBSERVATION,
        reason=reason,
        actor=actor,
        attempt=w.attempt,
        data=data,
    )


def warn_idle(w: Watched, now: dt.datetime) -> bool:
    """The first step: the event and the notification, once per idle spell."""
    since = idle_since(w)
    idle = say((now - since).total_seconds())
    with transaction.atomic():
        if not _claim(w, "idle_warned_at", since, now):
            return False
        action = "paused" if w.idle_action == "pause" else "stopped"
        _event(
            w,
            f"idle for {idle}: its GPUs did no work (or, without GPU readings, its ranks made "
            f"no progress); unless it works again within {say(w.idle_grace_s)} it gets the "
            f"checkpoint notice and is {action} by its team's idle policy",
            IDLE_ACTOR,
            now,
            idle_since=since.isoformat(),
        )
        outbox.on_watch(Webhook.Event.IDLE, [w.job_id], since, now)
    return True


def notice_idle(w: Watched, now: dt.datetime) -> bool:
    """The second step: the checkpoint notice, then the pause (or stop) through halt."""
    since = idle_since(w)
    idle = say((now - since).total_seconds())
    target = S.PAUSED if w.idle_action == "pause" else S.STOPPED
    with transaction.atomic():
        if not _claim(w, "idle_noticed_at", since, now):
            return False
        _event(
            w,
            f"checkpoint notice: idle for {idle}, past its team's idle grace",
            IDLE_ACTOR,
            now,
            idle_since=since.isoformat(),
        )
        verb = "paused" if target == S.PAUSED else "stopped"
        halted = halt(
            [w.job_id],
            target,
            f"{verb} by its team's idle policy: idle for {idle}",
            actor=IDLE_ACTOR,
            now=now,
            expected={S.RUNNING},
        )
    return bool(halted.halted)


def report_hang(w: Watched, dumps: list, now: dt.datetime) -> bool:
    """A suspected hang: the event with every rank's dump and the ranks still moving, the
    notification, then the team's hang_action. Once per stalled spell."""
    since = stalled_since(w)
    still = say((now - since).total_seconds())
    moving = moving_ranks(w, now)
    named = f"; rank(s) {', '.join(map(str, moving))} still progressing" if moving else ""
    reason = f"suspected hang: no progress for {still} (no line, no metric, flat CPU/GPU){named}"
    with transaction.atomic():
        if not _claim(w, "hang_reported_at", since, now):
            return False
        _event(
            w,
            reason,
            HANG_ACTOR,
            now,
            stalled_since=since.isoformat(),
            moving_ranks=moving,
            dumps=dumps or [],
            action=w.hang_action,
        )
        outbox.on_watch(Webhook.Event.HUNG, [w.job_id], since, now)
        _hang_action(w, reason, now)
    return True


def _hang_action(w: Watched, reason: str, now: dt.datetime) -> None:
    if w.hang_action == "stop":
        halt(
            [w.job_id],
            S.STOPPED,
            f"stopped by its team's hang policy: {reason}",
            actor=HANG_ACTOR,
            now=now,
            expected={S.RUNNING},
        )
    elif w.hang_action == "fail":
        attempt = Attempt.objects.select_related("job").get(pk=w.attempt_id)
        end = ends.End(
            target=S.FAILED,
            reason=f"failed by its team's hang policy: {reason}",
            failure=Failure.HUNG,
        )
        if ends.end_attempt(attempt, end, now, actor=HANG_ACTOR):
            _keep_off_hung_nodes(attempt, now)
            transaction.on_commit(lambda: cancel_attempt(w.attempt_id))


def _keep_off_hung_nodes(attempt: Attempt, now: dt.datetime) -> None:
    """The nodes a hung attempt ran on (its ranks, as the engine last reported them) join its
    job's `avoid_nodes`, the newest last and each once: every later attempt of the job (a retry,
    a resume) is kept off them, and off those of earlier hangs while enough nodes are left
    (`jobs.executors.base.nodes_to_avoid`, applied by the scheduler's placement and by the
    engine). A note tells the job's readers why. Where the engine cannot keep an attempt off a
    node (`AVOIDS_NODES` unset: local, Ray, Kubernetes) nothing is kept."""
    nodes = list(dict.fromkeys(r["node"] for r in attempt.ranks or [] if r.get("node")))
    kind = Cluster.objects.values_list("kind", flat=True).get(pk=attempt.job.cluster_id)
    if not nodes or not getattr(executor_class(kind), "AVOIDS_NODES", False):
        return
    job = Job.objects.select_for_update().only("avoid_nodes").get(pk=attempt.job_id)
    Job.objects.filter(pk=job.pk).update(
        avoid_nodes=[n for n in job.avoid_nodes if n not in nodes] + nodes
    )
    which = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {', '.join(nodes)}"
    JobEvent.objects.create(
        job_id=attempt.job_id,
        time=now,
        kind=JobEvent.Kind.NOTE,
        reason=(
            f"its retries avoid {which}, which hung attempt {attempt.number} ran on (while "
            "the cluster has enough other nodes for the job)"
        ),
        actor=HANG_ACTOR,
        attempt=attempt.number,
        data={"avoid_nodes": nodes, "hung_attempt": attempt.number},
    )
