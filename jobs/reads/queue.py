"""Where QUEUED jobs stand, as the API, the CLI and the console show it: the latest
scheduler tick's plan (`jobs.loops.queueplan`, kept by `jobs.stores.queueplan`; a few seconds
old at most, see `jobs.loops.scheduler.QUEUE_PLAN_EVERY_S`) read for the jobs shown,
in one round trip, with what the reader may see of the jobs ahead: the job itself is visible to
them, so its team's jobs are named; another team's jobs are counted and their GPUs shown, never
named (staff see every id)."""

import datetime as dt
import functools

from jobs.models import Job
from jobs.states import JobStatus
from jobs.stores import queueplan
from jobs.stores.queueplan import PLAN_DEPTH

NO_PLAN = "not placed yet: the scheduler has not planned the queue"
KEPT_PLACES = 4_000  # places made of entries, per process (a few pages of the largest size)
SINCE = "not placed yet: queued since the scheduler's last tick, which places it next"
EMPTY: dict[str, object] = {
    "queue_position": None,
    "team_queue_position": None,
    "ahead": [],
    "ahead_jobs": None,
    "ahead_gpus": None,
    "estimated_start": None,
    "estimate_reason": "",
    "planned_at": None,
}


def queue_places(jobs: list[dict], staff: bool) -> dict[int, dict]:
    """The queue fields of each job of `jobs` (rows with `id`, `status`, `team_id`,
    `cluster_id` and `status_changed_at`): EMPTY for a job that is not QUEUED."""
    queued = [job for job in jobs if job["status"] == JobStatus.QUEUED]
    entries, waiting, at = queueplan.read(
        [job["id"] for job in queued], {job["cluster_id"] for job in queued}
    )
    places = {job["id"]: EMPTY for job in jobs}
    for job in queued:
        packed = entries.get(job["id"])
        if packed is not None:
            places[job["id"]] = _place(packed, job["team_id"], staff, at)
        elif at is None:
            places[job["id"]] = {**EMPTY, "estimate_reason": NO_PLAN}
        elif job["status_changed_at"].timestamp() > at:
            places[job["id"]] = {**EMPTY, "estimate_reason": SINCE}
        else:  # further back than the plan keeps
            total = waiting.get(job["cluster_id"], 0)
            places[job["id"]] = {
                **EMPTY,
                "estimate_reason": f"more than {PLAN_DEPTH:,} jobs wait ahead of it on its "
                f"cluster ({total:,} waiting); places are kept for the first {PLAN_DEPTH:,}",
                "planned_at": _time(at),
            }
    return places


def queue_row(job: Job) -> dict:
    """What queue_places reads of a job model."""
    fields = ("status", "team_id", "cluster_id", "status_changed_at")
    return {"id": job.pk, **{name: getattr(job, name) for name in fields}}


@functools.lru_cache(maxsize=KEPT_PLACES)
def _place(packed: queueplan.Packed, team_id: int, staff: bool, at: float | None) -> dict:
    """Kept while the entry stays as it is: a list shows the same places again and again,
    between ticks and under a long queue's ticks alike. Shared by the answers that show it, so
    nobody may change it."""
    entry = queueplan.unpack(packed)
    ahead = [
        {
            "id": job if staff or team == team_id else None,
            "same_team": team == team_id,
            "total_gpus": total_gpus,
            "gpus": total_gpus,  # /api/v1's first name for it (AheadOut)
        }
        for job, team, total_gpus in entry["a"]
    ]
    start = entry["e"]
    return {
        "queue_position": entry["c"],
        "team_queue_position": entry["t"],
        "ahead": ahead,
        "ahead_jobs": entry["n"],
        "ahead_gpus": entry["g"],
        "estimated_start": _time(start),
        "estimate_reason": entry["w"],
        "planned_at": _time(at),
    }


def _time(epoch: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(epoch, dt.UTC) if epoch is not None else None
