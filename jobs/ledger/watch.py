"""The activity watch's writes: the idle warning, the idle notice and its pause or stop, and
the suspected hang with its stack dumps and the hang action.

Each step is written once per idle or stalled spell: a guarded update of the attempt's
activity row (`WHERE <step> IS NULL OR <step> < spell`) claims it, so two ticks never both
write it, and the event, the webhook deliveries (`jobs.ledger.outbox.on_watch`) and what
follows go in the same transaction. A pause or stop goes through `jobs.ledger.halt` (whose
cancel, after commit, is the runner's notice: the notice file, SIGTERM, SIGKILL after the
grace); a hang's fail through `jobs.ledger.ends` with cause `hung` (retried per the job's
budget), its engine told to cancel after commit. The job's dumps are its own text: kept in the
event's data, bounded by the ingest route, escaped wherever shown.
"""

import datetime as dt

from django.db import transaction
from django.db.models import Q
from sf.contract import Failure

from jobs.durations import say
from jobs.ledger import ends, outbox
from jobs.ledger.halt import cancel_attempt, halt
from jobs.models import Attempt, AttemptActivity, JobEvent, Webhook
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
            transaction.on_commit(lambda: cancel_attempt(w.attempt_id))
