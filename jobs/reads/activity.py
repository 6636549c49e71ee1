"""What the activity watch reads and the rule it reads by: the running attempts under a team's
idle or hang policy (one query for them all), and, from an attempt's activity row, since when
it has been idle and since when it has been stalled, whether its stack dumps are fresh, and
whether a report should be answered with a request for them.

The rule, one place for the runner's answer (`jobs.api.activity`) and the watch's step
(`jobs.loops.activity`):
- **idle** since the last report that showed work (a GPU at the utilisation threshold or,
  without NVML, a rank's progress: a line, CPU, a metric point) — or the attempt's start;
- **stalled** since the later of the job's last metric point and the oldest last progress of
  its ranks: some rank has made no progress (no line, flat CPU, flat GPU) and the job logged
  nothing. A rank that still moved within `hang_after` while another waits is named.
A runner that stops reporting refreshes nothing, so its job goes on looking idle and still.
"""

import datetime as dt
from dataclasses import dataclass

from jobs.models import AttemptActivity, IdleExemption, Job, JobEvent
from jobs.states import JobStatus
from metering.activity import figures

DUMP_WAIT_S = 5.0  # past hang_after, how long a hang's event waits for its dumps


@dataclass(frozen=True)
class Watched:
    """A RUNNING job's current attempt under a policy, as the watch's step reads it."""

    job_id: int
    team_id: int
    attempt_id: int
    attempt: int
    nodes: int
    start: dt.datetime
    idle_after_s: int | None
    idle_grace_s: int
    idle_action: str
    hang_after_s: int | None
    hang_action: str
    exempt: bool
    busy_at: dt.datetime | None
    moved_at: dt.datetime | None
    stepped_at: dt.datetime | None
    ranks_moved: dict
    dumps_at: dt.datetime | None
    idle_warned_at: dt.datetime | None
    idle_noticed_at: dt.datetime | None
    hang_reported_at: dt.datetime | None


_A = "current_attempt__activity__"
_P = "team__activity_policy__"
FIELDS = {
    "job_id": "id",
    "team_id": "team_id",
    "attempt_id": "current_attempt_id",
    "attempt": "current_attempt__number",
    "nodes": "current_attempt__nodes",
    "start": "current_attempt__start_time",
    "idle_after_s": _P + "idle_after_s",
    "idle_grace_s": _P + "idle_grace_s",
    "idle_action": _P + "idle_action",
    "hang_after_s": _P + "hang_after_s",
    "hang_action": _P + "hang_action",
    "exempt": "idle_exemption__at",
    "busy_at": _A + "busy_at",
    "moved_at": _A + "moved_at",
    "stepped_at": _A + "stepped_at",
    "ranks_moved": _A + "ranks_moved",
    "dumps_at": _A + "dumps_at",
    "idle_warned_at": _A + "idle_warned_at",
    "idle_noticed_at": _A + "idle_noticed_at",
    "hang_reported_at": _A + "hang_reported_at",
}


def watched_attempts() -> list[Watched]:
    """Every RUNNING job with a started attempt whose team has an idle or hang policy."""
    rows = (
        Job.objects.filter(
            status=JobStatus.RUNNING,
            current_attempt__start_time__isnull=False,
            current_attempt__end_time__isnull=True,
            team__activity_policy__isnull=False,
        )
        .order_by("id")
        .values_list(*FIELDS.values())
    )
    out = []
    for row in rows:
        values = dict(zip(FIELDS, row, strict=True))
        values["exempt"] = values["exempt"] is not None
        values["ranks_moved"] = values["ranks_moved"] or {}
        out.append(Watched(**values))
    return out


def idle_since(w: "Watched") -> dt.datetime:
    return max(filter(None, (w.busy_at, w.start)))


def rank_moved(w: "Watched", rank: int) -> dt.datetime:
    """When a rank last made progress (its attempt's start, if it never reported any)."""
    at = w.ranks_moved.get(str(rank))
    if isinstance(at, int | float):
        return max(w.start, dt.datetime.fromtimestamp(at, dt.UTC))
    return w.start


def watched_ranks(w: "Watched") -> list[int]:
    """The ranks whose runner reports (a pod's rank other than 0 reports nothing of its own),
    or all of them before any report came."""
    reported = sorted(int(r) for r in w.ranks_moved if r.isdigit() and int(r) < w.nodes)
    return reported or list(range(max(w.nodes, 1)))


def stalled_since(w: "Watched") -> dt.datetime:
    oldest_rank = min(rank_moved(w, rank) for rank in watched_ranks(w))
    return max(filter(None, (w.stepped_at, oldest_rank, w.start)))


def moving_ranks(w: "Watched", now: dt.datetime) -> list[int]:
    """Ranks that made progress within hang_after: still working while another waits."""
    window = dt.timedelta(seconds=w.hang_after_s or 0)
    return [r for r in watched_ranks(w) if now - rank_moved(w, r) < window]


def dumps_fresh(w: "Watched") -> bool:
    return w.dumps_at is not None and w.dumps_at >= stalled_since(w)


def hang_reported(w: "Watched") -> bool:
    return w.hang_reported_at is not None and w.hang_reported_at >= stalled_since(w)


def dump_lead_s(hang_after_s: int) -> float:
    """How long before hang_after the runner is asked for its dumps, so they are there in
    time: at most half of hang_after, at most 10 s."""
    return min(10.0, hang_after_s / 2)


def wants_dump(w: "Watched", now: dt.datetime) -> bool:
    """Whether a report of this attempt is answered with a request for its stacks."""
    if not w.hang_after_s or dumps_fresh(w) or hang_reported(w):
        return False
    stalled = (now - stalled_since(w)).total_seconds()
    return stalled >= w.hang_after_s - dump_lead_s(w.hang_after_s)


def watched(job_id: int) -> "Watched | None":
    """One job's row, for the runner's answer (None: not RUNNING, or no policy)."""
    rows = (
        Job.objects.filter(pk=job_id, status=JobStatus.RUNNING, team__activity_policy__isnull=False)
        .exclude(current_attempt__start_time__isnull=True)
        .values_list(*FIELDS.values())
    )
    for row in rows:
        values = dict(zip(FIELDS, row, strict=True))
        values["exempt"] = values["exempt"] is not None
        values["ranks_moved"] = values["ranks_moved"] or {}
        return Watched(**values)
    return None


def diagnosis(job_id: int, attempt_id: int | None, billed_gpu_s: float) -> list[str]:
    """The Diagnostics tab's sentences: the current attempt's active and idle GPU-time, its
    idle exemption, and its latest suspected hang with every rank's stacks (the job's own
    text: the page escapes it)."""
    sentences = []
    row = AttemptActivity.objects.filter(attempt_id=attempt_id).first() if attempt_id else None
    if row is not None and billed_gpu_s > 0:
        shown = figures(row.active_gpu_us, row.idle_gpu_us, billed_gpu_s)
        sentences.append(
            f"Its GPUs worked {shown.active_gpu_s:.0f} of the {billed_gpu_s:.0f} GPU-seconds "
            f"billed for this attempt ({(shown.efficiency or 0) * 100:.0f} % efficiency) and "
            f"idled {shown.idle_gpu_s:.0f}, by the runner's activity reports."
        )
    exemption = IdleExemption.objects.select_related("by").filter(job_id=job_id).first()
    if exemption is not None:
        why = f" ({exemption.reason})" if exemption.reason else ""
        sentences.append(
            f"Exempt from its team's idle policy by {exemption.by.username} at "
            f"{exemption.at:%Y-%m-%d %H:%M} UTC{why}."
        )
    hang = (
        JobEvent.objects.filter(job_id=job_id, reason__startswith="suspected hang")
        .order_by("-id")
        .first()
    )
    if hang is not None:
        sentences.append(
            f"At {hang.time:%Y-%m-%d %H:%M:%S} UTC, attempt {hang.attempt}: {hang.reason}."
        )
        dumps = hang.data.get("dumps") if isinstance(hang.data, dict) else None
        for dump in dumps or [{"rank": "-", "text": "no stack dump arrived from the runner"}]:
            sentences.append(f"Rank {dump.get('rank')}'s Python stacks:\n{dump.get('text')}")
    return sentences


WATCH_EVENTS = {"idle": "idle for", "suspected-hang": "suspected hang"}


def watch_note(job_id: int, event: str) -> dict | None:
    """What a notification of the watch says: the latest event of its kind (its sentence, and
    for a hang every rank's stacks and the ranks still moving); the job's own text in the dumps
    is data, escaped by whatever shows it (Slack's text carries only the sentence)."""
    prefix = WATCH_EVENTS.get(event)
    if prefix is None:
        return None
    found = (
        JobEvent.objects.filter(job_id=job_id, reason__startswith=prefix)
        .order_by("-id")
        .values_list("reason", "attempt", "data")
        .first()
    )
    if found is None:
        return None
    reason, attempt, data = found
    data = data if isinstance(data, dict) else {}
    return {
        "reason": reason,
        "attempt": attempt,
        "dumps": data.get("dumps", []),
        "moving_ranks": data.get("moving_ranks", []),
    }
