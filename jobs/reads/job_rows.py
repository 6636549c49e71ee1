"""The API's hot reads of jobs as plain rows: one job, a page of jobs, a job's timeline.

Each reads only the columns its answer shows, joined in one query whose SQL is built once per
process (`jobs.reads.prepared`), and instantiates no model: a page of 50 jobs used to build
some 200 model objects and decode every cluster's settings 50 times. A job's row comes with
what its answer shows of the row alone (`jobs.reads.job_out.shown_of`), kept for the row as
the database sends it (ROWS): a page listed again converts and builds only the jobs that moved.
Who sees what is `visible_jobs`, as everywhere else.
"""

from collections import defaultdict
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import QuerySet

from jobs.models import BIGINT_MAX, Attempt
from jobs.reads.job_out import Started, shown_of
from jobs.reads.prepared import Prepared, RowMemo, reader
from jobs.reads.visible import visible_jobs

# What JobOut shows, as `values_list` paths; the current attempt's columns come joined.
JOB_COLUMNS = (
    "id",
    "run_id",
    "name",
    "team__name",
    "team_id",
    "cluster_id",
    "status_changed_at",
    "user__username",
    "cluster__name",
    "cluster__kind",
    "cluster__gpus_virtual",
    "cluster__settings__output_root",
    "status",
    "status_reason",
    "total_gpus",
    "nodes",
    "gpu_type",
    "cpus",
    "memory_mb",
    "image",
    "entrypoint",
    "priority",
    "window__name",
    "window_policy",
    "attempt_count",
    "retry_count",
    "submitted_at",
    "snapshot_id",
    "snapshot__deleted_reason",
    "max_retries",
    "retry_cooldown_s",
    "time_limit_s",
    "next_attempt_at",
    "parent_id",
    "follow_on_name",
    "then",
    "current_attempt__ranks",
    "current_attempt__job_ref",
    "current_attempt__start_time",
    "current_attempt__end_time",
    "current_attempt__exit_code",
    "current_attempt__borrowed_from__name",
    "current_attempt__total_gpus",
    "current_attempt__activity__active_gpu_us",
    "current_attempt__activity__idle_gpu_us",
    "current_attempt__preempted_at",
    "cluster__settings__preempt_grace_s",
    "array_id",
    "array_index",
)
# Rows kept with what they show, per process: a few pages of the largest size (500), for
# everyone listing and reading the jobs of the moment; 4 to 8 kB a row (16 MB at most).
KEPT_ROWS = 2_000
EVENT_COLUMNS = ("time", "kind", "from_status", "to_status", "reason", "actor", "attempt", "data")
# What events written before lenders went unnamed kept of a lender in its borrower's timeline
# (another team's id, name, holdings and quota): never shown.
LENDER_KEYS = frozenset(("lender_id", "borrowed_from", "lender_gpus", "lender_quota", "lender"))


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a page lists; None or False: that filter does not apply."""

    status: str | None = None  # a JobStatus value
    team: str | None = None
    user: str | None = None  # a username
    mine: bool = False
    before: int | None = None
    limit: int = 50
    tasks: bool = True  # False: leave out the tasks of arrays (`sf job list` shows arrays)


def _one_job(shape: tuple, job_id: int, user_id: int = 0) -> QuerySet:
    (staff,) = shape
    return visible_jobs(reader(user_id, staff)).filter(pk=job_id).values_list(*JOB_COLUMNS)


def _page(shape: tuple, user_id: int = 0, **values: int | str) -> QuerySet:
    return _page_jobs(shape, user_id, **values).values_list(*JOB_COLUMNS)[: shape[-1]]


def _page_jobs(shape: tuple, user_id: int = 0, **values: int | str) -> QuerySet:
    staff, status, team, user, mine, before, no_tasks, _ = shape
    jobs = visible_jobs(reader(user_id, staff))
    if no_tasks:
        jobs = jobs.filter(array__isnull=True)
    if status:
        jobs = jobs.filter(status=values["status"])
    if team:
        jobs = jobs.filter(team__name=values["team"])
    if mine:
        jobs = jobs.filter(user_id=user_id)
    elif user:
        jobs = jobs.filter(user__username=values["user"])
    if before:
        jobs = jobs.filter(pk__lt=values["before"])
    return jobs.order_by("-pk")


def _started_attempts(shape: tuple, job_id: int) -> QuerySet:
    return _billable(Attempt.objects.filter(job_id=job_id))


def _billable(attempts: QuerySet) -> QuerySet:
    """What a job's GPU-seconds are summed from: its attempts that started."""
    return attempts.filter(start_time__isnull=False).values_list(
        "job_id", "start_time", "end_time", "total_gpus"
    )


def _timeline(shape: tuple, job_id: int, user_id: int = 0) -> QuerySet:
    # One query for the check and the events: a visible job without events is one row of
    # NULLs (the join is an outer one), an invisible job no row at all.
    (staff,) = shape
    jobs = visible_jobs(reader(user_id, staff)).filter(pk=job_id)
    return jobs.order_by("events__id").values_list(*(f"events__{c}" for c in EVENT_COLUMNS))


def _started_of_page(
    shape: tuple, user_id: int = 0, low: int = 0, high: int = 0, **values: int | str
) -> QuerySet:
    # The page's jobs again, as the visible ones between its lowest and highest id: the same
    # jobs even if another was submitted since the page was read (a job committed late with an
    # id in between only adds attempts nobody reads). A list of the page's ids would be 51
    # parameters, past the 50 whose SQL conversion psycopg caches (0.4 ms a request here).
    page = _page_jobs(shape, user_id, **values).filter(pk__range=(low, high))
    return _billable(Attempt.objects.filter(job_id__in=page.values("pk")))


ONE_JOB = Prepared(_one_job)
PAGE = Prepared(_page)
STARTED_ATTEMPTS = Prepared(_started_attempts)
STARTED_OF_PAGE = Prepared(_started_of_page)
TIMELINE = Prepared(_timeline)


# What each answer works out anew from a job's row: where it queues, its GPU-seconds, whether
# a retry would find its snapshot, who lent its GPUs (staff only) (`jobs.reads.queue`,
# `jobs.reads.job_out.job_out`).
FACTS = (
    "id",
    "status",
    "team_id",
    "cluster_id",
    "status_changed_at",
    "attempt_count",
    "current_attempt__start_time",
    "snapshot_id",
    "snapshot__deleted_reason",
    "current_attempt__borrowed_from__name",
    "current_attempt__end_time",
    "current_attempt__total_gpus",
    "current_attempt__activity__active_gpu_us",
    "current_attempt__activity__idle_gpu_us",
)


@dataclass(frozen=True, slots=True)
class JobRow:
    job: dict  # FACTS of the row, by column name
    shown: dict  # what JobOut shows of the row alone (`jobs.reads.job_out.shown_of`)


def _job_row_of(row: list) -> JobRow:
    job = dict(zip(JOB_COLUMNS, row, strict=True))
    return JobRow({name: job[name] for name in FACTS}, shown_of(job))


ROWS = RowMemo(_job_row_of, KEPT_ROWS)  # ONE_JOB's and PAGE's: the same columns


def _reader_values(user: User) -> dict[str, int | str]:
    """The reader's parameter: staff see every job, so their reads have none."""
    return {} if user.is_staff else {"user_id": user.pk}


def job_row(user: User, job_id: int) -> tuple[JobRow, list[Started]] | None:
    """The job's row, with its started attempts; None when the user cannot see it (or it does
    not exist)."""
    if abs(job_id) > BIGINT_MAX:  # no row has it, and the database cannot be sent it
        return None
    rows = ONE_JOB.built(ROWS, (user.is_staff,), job_id=job_id, **_reader_values(user))
    if not rows:
        return None
    if not may_have_started(rows[0].job):  # a submit's answer, a queued or pending job
        return rows[0], []
    started = STARTED_ATTEMPTS.rows(job_id=job_id)
    return rows[0], [tuple(a[1:]) for a in started]


def may_have_started(job: dict) -> bool:
    """Whether any attempt of the job (its FACTS) may have started: its current
    attempt, the newest, has, or there were attempts before it. Otherwise there are no started
    attempts to read, and no GPU-seconds."""
    return job["attempt_count"] > 1 or job["current_attempt__start_time"] is not None


def job_page(user: User, jobs: JobFilter) -> tuple[list[JobRow], dict[int, list[Started]]]:
    """Up to `jobs.limit` jobs, newest first, and the started attempts of each."""
    values: dict[str, int | str] = {"user_id": user.pk} if jobs.mine else _reader_values(user)
    for name in ("status", "team"):
        if getattr(jobs, name):
            values[name] = getattr(jobs, name)
    if jobs.before:
        values["before"] = min(jobs.before, BIGINT_MAX)  # every id is below a larger one
    if jobs.user and not jobs.mine:
        values["user"] = jobs.user
    shape = (
        user.is_staff,
        bool(jobs.status),
        bool(jobs.team),
        "user" in values,
        jobs.mine,
        bool(jobs.before),
        not jobs.tasks,
        jobs.limit,
    )
    page = PAGE.built(ROWS, shape, **values)
    started: dict[int, list[Started]] = defaultdict(list)
    if any(may_have_started(row.job) for row in page):  # a page of waiting jobs bills nothing
        span = {"low": page[-1].job["id"], "high": page[0].job["id"]}
        for job_id, *attempt in STARTED_OF_PAGE.rows(shape, **values, **span):
            started[job_id].append(tuple(attempt))
    return page, started


def job_timeline(user: User, job_id: int) -> list[dict] | None:
    """The job's events in order, as EventOut's columns; None when the user cannot see it."""
    if abs(job_id) > BIGINT_MAX:
        return None
    rows = TIMELINE.rows((user.is_staff,), job_id=job_id, **_reader_values(user))
    if not rows:
        return None
    events = [dict(zip(EVENT_COLUMNS, row, strict=True)) for row in rows if row[0] is not None]
    for event in events:
        if isinstance(event["data"], dict) and not LENDER_KEYS.isdisjoint(event["data"]):
            event["data"] = {k: v for k, v in event["data"].items() if k not in LENDER_KEYS}
    return events
