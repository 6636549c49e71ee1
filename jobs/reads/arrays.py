"""Reading job arrays as a user may: which arrays they see, each one's counts per state, and
its tasks with their latest metric values. Nothing here writes; `jobs.actions.arrays` submits
arrays and acts on their tasks.

An array's status is its tasks': it has none of its own, so nothing can disagree with the
ledger. The counts of many arrays come from one grouped query, never one per array.
"""

from collections import defaultdict

from django.contrib.auth.models import User
from django.db.models import Count, QuerySet

from jobs.errors import NotFound
from jobs.models import Job, JobArray, Membership, MetricKind, MetricSeries
from jobs.states import JobStatus
from jobs.stores.metrics import charts

S = JobStatus
STATE_ORDER = (
    S.RUNNING,
    S.PENDING,
    S.SUBMITTED,
    S.QUEUED,
    S.PAUSED,
    S.FAILED,
    S.STOPPED,
    S.SUCCEEDED,
)
TASKS_SHOWN = 1000  # tasks one page (or answer) lists, by index
METRICS_SHOWN = 4  # latest values shown per task: the array's first metrics by name


def visible_arrays(user: User) -> QuerySet[JobArray]:
    arrays = JobArray.objects.select_related("team", "user").order_by("-pk")
    if user.is_staff:
        return arrays
    return arrays.filter(team_id__in=Membership.objects.filter(user=user).values("team_id"))


def get_visible_array(user: User, array_id: int) -> JobArray:
    array = visible_arrays(user).filter(pk=array_id).first()
    if array is None:
        raise NotFound(f"array {array_id} does not exist or belongs to a team you are not in")
    return array


def counts(array_ids: list[int]) -> dict[int, dict[str, int]]:
    """Tasks per state of each array, in one grouped query; states with none left out."""
    found: dict[int, dict[str, int]] = defaultdict(dict)
    rows = (
        Job.objects.filter(array_id__in=array_ids)
        .values("array_id", "status")
        .annotate(n=Count("id"))
    )
    for row in rows:
        found[row["array_id"]][row["status"]] = row["n"]
    return {pk: _ordered(found.get(pk, {})) for pk in array_ids}


def _ordered(by_state: dict[str, int]) -> dict[str, int]:
    return {state: by_state[state] for state in STATE_ORDER if state in by_state}


def summary(by_state: dict[str, int]) -> str:
    """ "3 RUNNING, 5 QUEUED, 24 SUCCEEDED" (the order people read progress in)."""
    return ", ".join(f"{n} {state}" for state, n in by_state.items()) or "no tasks"


def tasks(array: JobArray, limit: int = TASKS_SHOWN) -> list[Job]:
    return list(
        Job.objects.filter(array=array)
        .order_by("array_index")
        .only(
            "id", "array_index", "array_params", "status", "status_reason", "attempt_count",
            "retry_count", "status_changed_at", "run_id", "name", "team_id",
        )[:limit]
    )  # fmt: skip


def latest_values(job_ids: list[int]) -> tuple[list[str], dict[int, dict[str, float]]]:
    """The tasks' first training metrics by name (at most METRICS_SHOWN) and each task's
    latest value of them, in two queries whatever the number of tasks."""
    names = sorted(
        set(
            MetricSeries.objects.filter(job_id__in=job_ids, kind=MetricKind.TRAIN).values_list(
                "name", flat=True
            )
        )
    )[:METRICS_SHOWN]
    latest = charts.latest_of(job_ids, MetricKind.TRAIN) if names else {}
    values = {
        job_id: {name: point["value"] for name, point in by_name.items() if name in names}
        for job_id, by_name in latest.items()
    }
    return names, values


def task_rows(array: JobArray) -> tuple[list[str], list[dict]]:
    """The array's first tasks as the API and the array page show them, and the metric names
    their `latest` values are of: in three queries whatever the number of tasks."""
    shown = tasks(array)
    names, latest = latest_values([t.pk for t in shown])
    return names, [
        {
            "id": t.pk,
            "index": t.array_index,
            "params": t.array_params,
            "status": t.status,
            "reason": (t.status_reason.splitlines() or [""])[0][:300],
            "attempt": t.attempt_count,
            "retry_count": t.retry_count,
            "latest": latest.get(t.pk, {}),
        }
        for t in shown
    ]
