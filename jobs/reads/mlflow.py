"""What Starforge's MLflow endpoint shows (`jobs.api.mlflow`), as MLflow's JSON: experiments
(one per team), runs (one per attempt of a job) with their latest metrics, params and tags, and
a metric's history. Nothing here writes.

The mapping, for a reader of MLflow's client:
- experiment = team: `experiment_id` is the team's id as a string, `name` the team's name;
- run = one attempt of a job: `run_id` is `<job id>-<attempt>` (`run_key`), so the job id a
  person sees in `sf` and the console names its runs, and a resume or retry is a new run;
- its status is the ledger's, never what the job's code reported (docs/ARCHITECTURE.md,
  invariant 7): RUNNING while the attempt runs, SCHEDULED before, then FINISHED, FAILED or
  KILLED as the attempt ended.
A run or experiment of a team the reader is not in reads as one that does not exist.
"""

import re
from collections.abc import Iterable

from django.contrib.auth.models import User
from django.db.models import QuerySet

from jobs.models import Attempt, Job, MetricChunk, Team, TrackingValue
from jobs.reads.visible import visible_jobs
from jobs.states import JobStatus
from jobs.stores.metrics.chunks import unpack

S = JobStatus
RUN_KEY = re.compile(r"^([1-9][0-9]{0,17})-([1-9][0-9]{0,8})$")
# The run's MLflow status while its attempt is its job's current one, by the job's status.
CURRENT_STATUS = {
    S.QUEUED: "SCHEDULED",
    S.SUBMITTED: "SCHEDULED",
    S.PENDING: "SCHEDULED",
    S.RUNNING: "RUNNING",
    S.SUCCEEDED: "FINISHED",
    S.FAILED: "FAILED",
    S.STOPPED: "KILLED",
    S.PAUSED: "KILLED",
}


def run_key(run_id: str) -> tuple[int, int] | None:
    """(job id, attempt) of a run id `<job>-<attempt>`, or None for any other string."""
    match = RUN_KEY.match(run_id)
    return (int(match[1]), int(match[2])) if match else None


def run_id(job_id: int, attempt: int) -> str:
    return f"{job_id}-{attempt}"


def _teams(user: User) -> QuerySet[Team]:
    teams = Team.objects.all() if user.is_staff else Team.objects.filter(membership__user=user)
    return teams.order_by("name")


def experiment_json(team_id: int, name: str) -> dict:
    return {
        "experiment_id": str(team_id),
        "name": name,
        "artifact_location": "",
        "lifecycle_stage": "active",
        "tags": [],
    }


def experiment(user: User | None, team_id: int, name: str | None = None) -> dict | None:
    """The experiment of team `team_id` (or of that name), if `user` may read it (None: the
    caller has checked)."""
    teams = Team.objects.all() if user is None else _teams(user)
    found = teams.filter(**({"name": name} if name is not None else {"pk": team_id})).values_list(
        "pk", "name"
    )
    row = found.first()
    return experiment_json(*row) if row else None


def experiments(user: User, offset: int, limit: int) -> tuple[list[dict], int | None]:
    """A page of the experiments `user` may read, by name; the next page's offset."""
    rows = list(_teams(user).values_list("pk", "name")[offset : offset + limit + 1])
    after = offset + limit if len(rows) > limit else None
    return [experiment_json(*row) for row in rows[:limit]], after


def readable_attempt(user: User | None, job_id: int, number: int) -> Attempt | None:
    """Attempt `number` of job `job_id` with its job, if `user` may read it (None: the caller
    has checked)."""
    jobs = Job.objects.all() if user is None else visible_jobs(user)
    job = jobs.select_related("user").filter(pk=job_id).first()
    if job is None:
        return None
    attempt = Attempt.objects.filter(job_id=job_id, number=number).first()
    if attempt is not None:
        attempt.job = job
    return attempt


def run_json(attempt: Attempt) -> dict:
    """The MLflow `Run` of an attempt (its job loaded with its user)."""
    job = attempt.job
    values = tracking_values(job.pk, attempt.number)
    started = attempt.start_time or attempt.submitted_at
    info = {
        "run_id": run_id(job.pk, attempt.number),
        "run_uuid": run_id(job.pk, attempt.number),
        "run_name": job.name or job.run_id,
        "experiment_id": str(job.team_id),
        "user_id": job.user.username,
        "status": run_status(attempt),
        "start_time": _ms(started),
        "artifact_uri": "",
        "lifecycle_stage": "active",
    }
    if attempt.end_time is not None:
        info["end_time"] = _ms(attempt.end_time)
    return {
        "info": info,
        "data": {
            "metrics": latest_metrics(job.pk, attempt.number),
            "params": [{"key": k, "value": v} for k, v in values[TrackingValue.Kind.PARAM]],
            "tags": [{"key": k, "value": v} for k, v in values[TrackingValue.Kind.TAG]],
        },
        "inputs": {},
    }


def run_status(attempt: Attempt) -> str:
    job = attempt.job
    if job.current_attempt_id == attempt.pk:
        return CURRENT_STATUS[JobStatus(job.status)]
    if attempt.end_time is None:
        return "RUNNING"
    return "FINISHED" if attempt.exit_code == 0 else "FAILED"


def runs(user: User, team_ids: list[int], offset: int, limit: int) -> tuple[list[dict], int | None]:
    """A page of the runs of the jobs `user` may read in those teams, newest job first."""
    attempts = (
        Attempt.objects.filter(job__in=visible_jobs(user).filter(team_id__in=team_ids))
        .select_related("job", "job__user")
        .order_by("-job_id", "-number")
    )
    page = list(attempts[offset : offset + limit + 1])
    after = offset + limit if len(page) > limit else None
    return [run_json(attempt) for attempt in page[:limit]], after


def tracking_values(job_id: int, attempt: int) -> dict[str, list[tuple[str, str]]]:
    """The attempt's MLflow params and tags, each by key."""
    out: dict[str, list[tuple[str, str]]] = {kind: [] for kind in TrackingValue.Kind.values}
    rows = TrackingValue.objects.filter(job_id=job_id, attempt=attempt).order_by("kind", "key")
    for kind, key, value in rows.values_list("kind", "key", "value"):
        out[kind].append((key, value))
    return out


def job_params(job_ids: Iterable[int]) -> dict[int, dict[str, str]]:
    """Each job's MLflow params, of its latest attempt that logged any."""
    out: dict[int, dict[str, str]] = {}
    rows = TrackingValue.objects.filter(job_id__in=list(job_ids), kind=TrackingValue.Kind.PARAM)
    for job_id, attempt, key, value in rows.order_by("job_id", "-attempt").values_list(
        "job_id", "attempt", "key", "value"
    ):
        latest = out.setdefault(job_id, {"": str(attempt)})
        if latest[""] == str(attempt):
            latest[key] = value
    return {job_id: {k: v for k, v in params.items() if k} for job_id, params in out.items()}


def latest_metrics(job_id: int, attempt: int) -> list[dict]:
    """Each metric's latest point of the attempt (highest step, the last logged of it)."""
    newest: dict[str, tuple[int, int]] = {}
    chunks = MetricChunk.objects.filter(job_id=job_id, attempt=attempt).exclude(kind="system")
    for pk, name, max_step in chunks.values_list("pk", "name", "max_step"):
        if name not in newest or (max_step, pk) > newest[name]:
            newest[name] = (max_step, pk)
    ids = [pk for _, pk in newest.values()]
    out = []
    for name, points in MetricChunk.objects.filter(pk__in=ids).values_list("name", "points"):
        _, steps, values, ts = unpack(points)
        best = max(range(len(steps)), key=lambda i: (steps[i], i))
        out.append(_point(name, steps[best], values[best], ts[best]))
    return sorted(out, key=lambda m: m["key"])


def history(
    job_id: int, attempt: int, key: str, after_seq: int, limit: int
) -> tuple[list[dict], int | None]:
    """Up to `limit` points of metric `key` of the attempt, in the order they were logged, from
    seq `after_seq` on; the seq the next page starts at, or None after the last."""
    chunks = (
        MetricChunk.objects.filter(
            job_id=job_id, attempt=attempt, name=key, last_seq__gte=after_seq
        )
        .exclude(kind="system")
        .order_by("last_seq")
        .values_list("points", flat=True)
    )
    out: list[dict] = []
    for points in chunks.iterator(chunk_size=64):
        seqs, steps, values, ts = unpack(points)
        for seq, step, value, t in zip(seqs, steps, values, ts, strict=True):
            if seq < after_seq:
                continue
            if len(out) == limit:
                return out, seq
            out.append({"key": key, "value": value, "timestamp": round(t * 1000), "step": step})
    return out, None


def _point(name: str, step: int, value: float, ts: float) -> dict:
    return {"key": name, "value": value, "timestamp": round(ts * 1000), "step": step}


def _ms(moment) -> int:
    return int(moment.timestamp() * 1000)
