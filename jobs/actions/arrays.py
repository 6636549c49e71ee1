"""Job arrays: `sf submit --array 0-31[:step] --max-parallel 8 -- python train.py --seed
'{index}'` (or `--array-file params.jsonl`, one parameter set per line) makes one array of N
tasks, each a full job of the ledger with its own states, attempts, retries, logs, metrics and
GPU-seconds, all sharing the submission's snapshot; and the verbs act on every task of an
array that allows them.

A submission passes every check a single job's does (`jobs.actions.submit.prepare`), once for
all its tasks, then writes the array, its tasks and their first events in one transaction of a
few bulk inserts, whatever N (`jobs.ledger.creation`). The scheduler admits tasks through every
gate as it does jobs, and at most `max_parallel` of an array at once (`jobs.loops.gates`).

In each task's entrypoint, `{index}` becomes the task's index and `{NAME}` the value of its
parameter NAME (from the array file); other braces are left as they are. The runner sets
SF_ARRAY_ID, SF_ARRAY_INDEX and SF_ARRAY_PARAMS (JSON) for the task (`jobs.loops.launcher`).
"""

import json
import re
from collections.abc import Iterable

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs import grants, kick
from jobs.actions import submit
from jobs.errors import BadRequest, Conflict, Forbidden
from jobs.ledger import creation, halt
from jobs.ledger.transitions import Change, apply_transitions
from jobs.models import Job, JobArray
from jobs.reads import teams
from jobs.reads.arrays import counts, get_visible_array
from jobs.reads.visible import retry_refusal
from jobs.schemas import ArrayIn, json_fault
from jobs.states import VERBS, JobStatus

S = JobStatus
MAX_TASKS = 10_000
MAX_INDEX = 1_000_000
MAX_PARAMS_BYTES = 4096  # one parameter set, as JSON
CHUNK = 500  # tasks one transaction of a verb moves
# The verbs `act` applies to every task that allows them: each job verb but delete.
ARRAY_VERBS = tuple(verb for verb in VERBS if verb != "delete")
RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def parse_spec(spec: str) -> list[int]:
    """The indices of `--array`: comma-separated indices and ranges, a range with an optional
    step ("0-31", "0-31:4", "1,3,10-20:2"), each index once, at most MAX_TASKS of them."""
    indices: list[int] = []
    for part in spec.replace(" ", "").split(","):
        match = RANGE.fullmatch(part)
        if match is None:
            raise BadRequest(
                f"--array {spec!r}: {part!r} is not an index or a range; write e.g. 0-31, "
                "0-31:4 or 1,3,5"
            )
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        step = int(match[3]) if match[3] is not None else 1
        if high < low:
            raise BadRequest(f"--array {spec!r}: the range {part} ends before it starts")
        if step < 1:
            raise BadRequest(f"--array {spec!r}: the step of {part} must be 1 or more")
        if high > MAX_INDEX:
            raise BadRequest(f"--array {spec!r}: indices go up to {MAX_INDEX}")
        if len(indices) + (high - low) // step + 1 > MAX_TASKS:
            raise BadRequest(
                f"--array {spec!r} makes more than {MAX_TASKS} tasks, the most one array has"
            )
        indices.extend(range(low, high + 1, step))
    if len(set(indices)) != len(indices):
        twice = next(i for i in indices if indices.count(i) > 1)
        raise BadRequest(f"--array {spec!r} gives index {twice} more than once")
    return indices


def check_params(params: list) -> list[dict]:
    """The array file's parameter sets: JSON objects of at most MAX_PARAMS_BYTES each; the
    error names the set by its line (the client sends the file's non-blank lines in order)."""
    if not params:
        raise BadRequest("the array file has no parameter sets; give one JSON object per line")
    if len(params) > MAX_TASKS:
        raise BadRequest(
            f"the array file has {len(params)} parameter sets; an array has at most {MAX_TASKS}"
        )
    for n, item in enumerate(params, 1):
        if not isinstance(item, dict):
            raise BadRequest(f"parameter set {n} of the array file is not a JSON object")
        # Its values reach the task's argv and SF_ARRAY_PARAMS, and the ledger keeps it.
        if fault := json_fault(item):
            raise BadRequest(f"parameter set {n} of the array file: {fault}")
        if len(json.dumps(item)) > MAX_PARAMS_BYTES:
            raise BadRequest(
                f"parameter set {n} of the array file is over {MAX_PARAMS_BYTES} bytes as JSON"
            )
    return params


def expand(entrypoint: list[str], index: int, params: dict | None) -> list[str]:
    """A task's argv: {index} and {NAME} of its parameters filled in, other braces kept."""
    values = {**(params or {}), "index": index}

    def fill(match: re.Match) -> str:
        name = match[1]
        if name not in values:
            return match[0]
        value = values[name]
        return value if isinstance(value, str) else json.dumps(value)

    return [PLACEHOLDER.sub(fill, arg) for arg in entrypoint]


def submit_array(user: User, data: ArrayIn) -> JobArray:
    if (data.array is None) == (data.array_params is None):
        raise BadRequest("give the tasks either as --array 0-31 or as --array-file, not both")
    if data.array is not None:
        tasks: list[tuple[int, dict | None]] = [(i, None) for i in parse_spec(data.array)]
        spec = data.array
    else:
        tasks = list(enumerate(check_params(data.array_params or [])))
        spec = "file"
    if data.then:
        raise BadRequest("--then does not apply to an array; submit the follow-on afterwards")
    if data.max_parallel is not None and not 1 <= data.max_parallel <= len(tasks):
        raise BadRequest(
            f"--max-parallel must be from 1 to the array's {len(tasks)} tasks, not "
            f"{data.max_parallel}"
        )
    prepared = submit.prepare(user, data)
    name = data.name or " ".join(data.entrypoint)[:190]
    with transaction.atomic():
        fields = submit.job_fields(user, data, prepared)
        array = JobArray.objects.create(
            team=prepared.team,
            user=user,
            name=name,
            spec=spec,
            size=len(tasks),
            max_parallel=data.max_parallel,
        )
        rows = [
            creation.build(
                name=f"{name}[{index}]"[:200],
                entrypoint=expand(data.entrypoint, index, task_params),
                env=data.env,
                array=array,
                array_index=index,
                array_params=task_params,
                **fields,
            )
            for index, task_params in tasks
        ]
        creation.queue(rows, f"submitted as a task of array {array.pk}", actor=user.username)
    return array


def act(user: User, array_id: int, verb: str, failed_only: bool = False) -> dict:
    """Apply `verb` (stop, pause, resume, retry) to every task of the array that allows it;
    the others are left as they are and counted. `failed_only`: retry the FAILED tasks only."""
    array = get_visible_array(user, array_id)
    if not teams.can_control_jobs(user, array.team_id):
        raise Forbidden(
            f"you can read array {array_id} but not control it "
            f"(viewer role in team {array.team.name})"
        )
    if failed_only and verb != "retry":
        raise BadRequest("--failed goes with retry only")
    allowed = VERBS[verb].allowed_from
    sources = {S.FAILED} if failed_only else allowed
    tasks = Job.objects.filter(array=array)
    chosen = tasks.filter(status__in=sources)
    if verb == "stop":
        # A FAILED task is stopped only to cancel its automatic retry: one that failed for
        # good stays FAILED, so `retry --failed` still finds it.
        chosen = chosen.exclude(status=S.FAILED, next_attempt_at__isnull=True)
    ids = list(chosen.order_by("pk").values_list("pk", flat=True))
    if verb == "retry" and ids:
        _check_retry(array)
    if verb in ("resume", "retry") and ids:
        _check_cluster(array)
    acted = 0
    for start in range(0, len(ids), CHUNK):
        acted += _apply(user, verb, ids[start : start + CHUNK], allowed)
    if acted and verb in ("resume", "retry"):
        kick.scheduler()
    by_state = counts([array.pk])[array.pk]
    return {
        "array": array.pk,
        "verb": verb,
        "acted": acted,
        "left": sum(by_state.values()) - acted,
        "counts": by_state,
    }


def _apply(user: User, verb: str, ids: list[int], allowed: Iterable[str]) -> int:
    now = timezone.now()
    actor = user.username
    if verb in ("stop", "pause"):
        target = S.STOPPED if verb == "stop" else S.PAUSED
        words = "stopped" if verb == "stop" else "paused"
        done = halt.halt(
            ids,
            target,
            f"{words} by {actor} (the whole array)",
            actor=actor,
            now=now,
            expected=set(allowed),
        )
        return len(done.halted)
    reason = f"{'resumed' if verb == 'resume' else 'retried'} by {actor} (the whole array); "
    reason += "waiting for the scheduler"
    with transaction.atomic():
        changed, _ = apply_transitions(
            S.QUEUED, [Change(pk, reason) for pk in ids], actor=actor, expected=set(allowed)
        )
        moved = [j.pk for j in changed]
        if verb == "resume":
            Job.objects.filter(pk__in=moved).update(paused_by_window=False)
        else:
            Job.objects.filter(pk__in=moved).update(
                retry_count=F("retry_count") + 1, next_attempt_at=None
            )
    return len(moved)


def _check_cluster(array: JobArray) -> None:
    """The tasks share one cluster: if the team may no longer use it, none goes back to the
    queue (the same 404 as an unknown cluster)."""
    task = Job.objects.filter(array=array).select_related("cluster").first()
    if task is not None:
        grants.check_may_use(array.team, task.cluster)


def _check_retry(array: JobArray) -> None:
    """The tasks share one snapshot: if it is gone, no task can be retried."""
    task = Job.objects.filter(array=array).select_related("snapshot").first()
    snapshot = task.snapshot if task else None
    why = retry_refusal(
        S.FAILED,
        snapshot.sha256 if snapshot else None,
        snapshot.deleted_reason if snapshot else "",
    )
    if why:
        raise Conflict(f"array {array.pk} cannot be retried: {why}")
