"""The accounting export (issue 50, point 5): one record per attempt with Slurm `sacct`'s field
names and meanings, so that a site that feeds `sacct -P` into its finance tools can feed
Starforge the same way, plus Starforge's own figures (metering's: GPU-seconds, idle
GPU-seconds, cost).

sacct's fields, as Starforge fills them:
- JobID: the Starforge job's id. Each attempt is a record of its own, as `sacct --duplicates`
  lists a requeued Slurm job once per run; `Attempt` numbers them and `EngineJobID` is the
  engine's id of the attempt (a Slurm job id, a pod, a Ray job), "" where it had none.
- User: the submitter's username. Account: the team. Partition: the cluster.
- Submit, Start, End: when the attempt was admitted and its billed start and end, in UTC,
  `YYYY-MM-DDTHH:MM:SS` (sacct's format; sacct prints the host's local time); "Unknown" for
  an end not reached yet, "" for a start that never came.
- ElapsedRaw: whole seconds of the billed run (up to now while it runs), as sacct's.
- AllocTRES: `node=N,gres/gpu:<type>=G` (`gres/gpu=G` when the GPUs are typeless; no gres
  when the attempt held none).
- State: COMPLETED, FAILED, CANCELLED (a stop or a pause), TIMEOUT, OUT_OF_MEMORY,
  NODE_FAIL (lost), PREEMPTED, RUNNING, PENDING: sacct's words for the attempt's end.
- ExitCode: `code:signal`, as sacct's (a job killed by signal 9 is `0:9`).

Starforge's own: GPUSeconds (metering's billed figure, exactly what usage adds up),
IdleGPUSeconds (metering's activity figure: 0 where the runner reported no activity), Cost
(at the prices in force when it ran, a decimal string in the server's currency) and Currency.

Who sees what: staff every team's records; a team admin the team's; a member their own
attempts in their teams. Rows never cross that line (the query is scoped before it runs).
"""

import csv
import datetime as dt
import io
from collections.abc import Iterable

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet
from django.utils import timezone
from sf.contract import Failure

from jobs.models import Attempt, Membership
from metering.activity import attempt_figures
from metering.cost import attempt_cost
from metering.prices import amount, currency, price_book
from metering.usage import attempt_gpu_seconds

COLUMNS = (
    "JobID",
    "Attempt",
    "EngineJobID",
    "User",
    "Account",
    "Partition",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "AllocTRES",
    "State",
    "ExitCode",
    "GPUSeconds",
    "IdleGPUSeconds",
    "Cost",
    "Currency",
)
# sacct's word for an attempt's failure cause.
STATES = {
    Failure.EXIT: "FAILED",
    Failure.OOM: "OUT_OF_MEMORY",
    Failure.LOST: "NODE_FAIL",
    Failure.PREEMPTED: "PREEMPTED",
    Failure.INGEST: "FAILED",
    Failure.DEADLINE: "TIMEOUT",
    Failure.REJECTED: "FAILED",
    Failure.TIMEOUT: "TIMEOUT",
}
STATES_BY_VALUE = {str(cause.value): word for cause, word in STATES.items()}
MAX_ROWS = 100_000  # one answer; a longer window is asked for in pieces
TIME = "%Y-%m-%dT%H:%M:%S"


class TooMany(Exception):
    """More records than one answer carries."""


def visible_attempts(user: User) -> QuerySet[Attempt]:
    """The attempts whose records `user` may export (see the module's docstring)."""
    rows = Attempt.objects.all()
    if user.is_staff:
        return rows
    mine = Membership.objects.filter(user=user)
    admin_of = mine.filter(role=Membership.Role.ADMIN).values("team_id")
    member_of = mine.values("team_id")
    return rows.filter(
        Q(job__team_id__in=admin_of) | Q(job__team_id__in=member_of, job__user_id=user.pk)
    )


def export_rows(
    user: User, start: dt.datetime, end: dt.datetime, now: dt.datetime | None = None
) -> list[dict[str, str]]:
    """The records of the attempts `user` may see that ran in [start, end) (any part of their
    billed run), or were admitted then and never ran; each whole, as sacct lists a job whose
    run overlaps its window. Ordered by submit time, then job and attempt."""
    now = now or timezone.now()
    ran = Q(start_time__lt=end) & (Q(end_time__isnull=True) | Q(end_time__gt=start))
    waited = Q(start_time__isnull=True, submitted_at__gte=start, submitted_at__lt=end)
    rows = (
        visible_attempts(user)
        .filter(ran | waited)
        .order_by("submitted_at", "job_id", "number")
        .values_list(
            "job_id", "number", "job_ref", "job__user__username", "job__team__name",
            "job__cluster__name", "job__cluster_id", "job__gpu_type", "submitted_at",
            "start_time", "end_time", "nodes", "total_gpus", "failure", "exit_code",
            "activity__idle_gpu_us", "activity__active_gpu_us",
        )[: MAX_ROWS + 1]
    )  # fmt: skip
    found = list(rows)
    if len(found) > MAX_ROWS:
        raise TooMany(f"more than {MAX_ROWS} attempts ran then: ask for a shorter window")
    book = price_book()
    return [_record(row, now, book) for row in found]


def _record(row: tuple, now: dt.datetime, book) -> dict[str, str]:
    (job_id, number, ref, username, team, cluster, cluster_id, gpu_type, submitted,
     start, end, nodes, gpus, failure, code, idle_us, active_us) = row  # fmt: skip
    billed = attempt_gpu_seconds(start, end, gpus, now)
    figures = attempt_figures(active_us, idle_us, start, end, gpus, now)
    elapsed = int(((end or now) - start).total_seconds()) if start else 0
    return {
        "JobID": str(job_id),
        "Attempt": str(number),
        "EngineJobID": ref,
        "User": username,
        "Account": team,
        "Partition": cluster,
        "Submit": _time(submitted),
        "Start": _time(start) if start else "",
        "End": _time(end) if end else "Unknown",
        "ElapsedRaw": str(max(0, elapsed)),
        "AllocTRES": alloc_tres(nodes, gpus, gpu_type),
        "State": state(start, end, failure, code),
        "ExitCode": exit_code(code),
        "GPUSeconds": f"{billed:.6f}",
        "IdleGPUSeconds": f"{figures.idle_gpu_s:.6f}",
        "Cost": amount(attempt_cost(cluster_id, gpu_type, start, end, gpus, now, book)),
        "Currency": currency(),
    }


def _time(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime(TIME)


def alloc_tres(nodes: int, gpus: int, gpu_type: str) -> str:
    """sacct's AllocTRES for an attempt: its nodes and GPUs (typed where the job asked)."""
    tres = f"node={nodes}"
    if gpus:
        tres += f",gres/gpu:{gpu_type}={gpus}" if gpu_type else f",gres/gpu={gpus}"
    return tres


def state(start, end, failure: str, code: int | None) -> str:
    """sacct's State for an attempt."""
    if end is None:
        return "RUNNING" if start else "PENDING"
    if failure:
        return STATES_BY_VALUE.get(failure, "FAILED")
    return "COMPLETED" if code == 0 else "CANCELLED"


def exit_code(code: int | None) -> str:
    """sacct's ExitCode, `code:signal`: the ledger keeps a signal N as -N."""
    if code is None:
        return "0:0"
    return f"0:{-code}" if code < 0 else f"{code}:0"


def as_csv(rows: Iterable[dict[str, str]]) -> str:
    """The records as CSV with a header of COLUMNS (what `csv.DictReader` reads back)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({name: _cell(row[name]) for name in COLUMNS})
    return out.getvalue()


def _cell(value: str) -> str:
    """A spreadsheet reads a cell starting with = + - @ as a formula: names come from users."""
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value
