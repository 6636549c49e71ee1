"""JobOut, the API's answer for a job, from a row of `jobs.reads.job_rows.JOB_COLUMNS`.

Most of it follows from the row alone (and settings): `shown`, which the row reads keep for
each row they meet (`jobs.reads.prepared.RowMemo`), so a job listed again unchanged costs no
conversion and no building, only the lookup of its row. Its datetimes are already written as
the API writes them (Django's rule, `DjangoJSONEncoder`), so rendering it is copying strings.
What changes with time or with what lies outside the row is worked out for every answer
(`job_out`): the GPU-seconds and their cost up to now (`metering`), and whether a retry would
find the job's snapshot.
"""

import datetime as dt

from django.core.serializers.json import DjangoJSONEncoder

from jobs.executors.base import PREEMPT_GRACE, preempt_grace_s
from jobs.gpus import to_gpus_per_node
from jobs.models import run_output_dir, virtual_gpus
from jobs.reads.visible import retry_refusal
from jobs.states import JobStatus
from metering.activity import attempt_figures
from metering.cost import job_cost
from metering.prices import amount, currency
from metering.usage import attempt_gpu_seconds

RANK_KEYS = frozenset(("rank", "node", "state", "exit_code"))
# start, end, GPUs in all of a started attempt
Started = tuple[dt.datetime, dt.datetime | None, int]
_written = DjangoJSONEncoder().default


def rank_rows(ranks: object) -> list[dict]:
    """An attempt's stored ranks as RankOut rows (the reconciler stored only checked rows)."""
    if not isinstance(ranks, list):
        return []
    return [
        {"rank": r["rank"], "node": r["node"], "state": r["state"], "exit_code": r["exit_code"]}
        for r in ranks
        if isinstance(r, dict) and isinstance(r.get("rank"), int) and RANK_KEYS <= r.keys()
    ]


def job_out(
    job: dict, shown: dict, started: list[Started], place: dict, now: dt.datetime, staff: bool
) -> dict:
    """JobOut of a job's row (`job`, by column name), what it shows of the row alone (`shown`,
    from `shown_of`), the job's started attempts and its queue fields (`jobs.reads.queue`).
    Only `staff` read which team a borrowing job's GPUs are lent by: another team's figures."""
    why_not_retry = retry_refusal(
        job["status"], job["snapshot_id"], job["snapshot__deleted_reason"] or ""
    )
    gpu_seconds = sum(
        attempt_gpu_seconds(start, end, total_gpus, now) for start, end, total_gpus in started
    )
    return {
        **shown,
        "gpu_seconds": float(round(gpu_seconds, 3)),
        "cost": amount(job_cost(job["cluster_id"], shown["gpu_type"], started, now)),
        "currency": currency(),
        **_activity(job, now),
        "retry_available": not why_not_retry,
        "retry_unavailable_reason": why_not_retry,
        "borrowed_from": job["current_attempt__borrowed_from__name"]
        if staff and shown["borrowed"]
        else None,
        **place,
    }


def _activity(job: dict, now: dt.datetime) -> dict:
    """The current attempt's active and idle GPU-seconds and efficiency (`metering.activity`)."""
    shown = attempt_figures(
        job["current_attempt__activity__active_gpu_us"],
        job["current_attempt__activity__idle_gpu_us"],
        job["current_attempt__start_time"],
        job["current_attempt__end_time"],
        job["current_attempt__total_gpus"] or 0,
        now,
    )
    return {
        "active_gpu_seconds": round(shown.active_gpu_s, 3),
        "idle_gpu_seconds": round(shown.idle_gpu_s, 3),
        "efficiency": shown.efficiency,
    }


def shown_of(job: dict) -> dict:
    """What JobOut shows that the row alone decides (with settings), datetimes as written."""
    active = job["status"] in JobStatus.active()
    return {
        "id": job["id"],
        "run_id": job["run_id"],
        "name": job["name"],
        "team": job["team__name"],
        "user": job["user__username"],
        "cluster": job["cluster__name"],
        "backend": job["cluster__kind"],
        "status": job["status"],
        "status_reason": job["status_reason"],
        "terminal": job["status"] in JobStatus.terminal(),
        "total_gpus": job["total_gpus"],
        "gpus": job["total_gpus"],  # /api/v1's first name for it (JobOut)
        "nodes": job["nodes"],
        "gpus_per_node": to_gpus_per_node(job["total_gpus"], job["nodes"]),
        "gpu_type": job["gpu_type"],
        "cpus": job["cpus"],
        "memory_mb": job["memory_mb"],
        "image": job["image"],
        "ranks": rank_rows(job["current_attempt__ranks"]),
        "virtual_gpus": virtual_gpus(job["cluster__kind"], job["cluster__gpus_virtual"]),
        "entrypoint": job["entrypoint"],
        "priority": job["priority"],
        "window": job["window__name"],
        "window_policy": job["window_policy"],
        "attempt": job["attempt_count"],
        "retry_count": job["retry_count"],
        "job_ref": job["current_attempt__job_ref"] or "",
        "submitted_at": _time(job["submitted_at"]),
        "started_at": _time(job["current_attempt__start_time"]),
        "ended_at": _time(job["current_attempt__end_time"]),
        "exit_code": job["current_attempt__exit_code"],
        "output_dir": run_output_dir(job["cluster__settings__output_root"], job["run_id"]),
        "snapshot": job["snapshot_id"],
        "max_retries": job["max_retries"],
        "retries_left": max(0, job["max_retries"] - job["retry_count"]),
        "retry_cooldown_s": job["retry_cooldown_s"],
        "time_limit_s": job["time_limit_s"],
        "next_attempt_at": _time(job["next_attempt_at"]),
        "parent": job["parent_id"],
        "follow_on_name": job["follow_on_name"],
        "then": job["then"],
        "borrowed": active and job["current_attempt__borrowed_from__name"] is not None,
        "array": job["array_id"],
        "array_index": job["array_index"],
        **_preemption(job, active),
    }


def _preemption(job: dict, active: bool) -> dict:
    """When an active job was told to give its borrowed GPUs back, and when SIGKILL follows."""
    notice = job["current_attempt__preempted_at"] if active else None
    if notice is None:
        return {"preempted_at": None, "preempt_kill_at": None}
    grace = preempt_grace_s({PREEMPT_GRACE: job["cluster__settings__preempt_grace_s"]})
    return {
        "preempted_at": _time(notice),
        "preempt_kill_at": _time(notice + dt.timedelta(seconds=grace)),
    }


def _time(value: dt.datetime | None) -> str | None:
    return None if value is None else _written(value)
