"""The job arrays API (`/api/v1/arrays`): submit an array, read arrays with their counts per
state and tasks, and act on every task of one (`jobs.actions.arrays` owns the rules)."""

import datetime as dt
from typing import Any, Literal

from ninja import Query, Router, Schema, Status
from pydantic import Field

from jobs.actions import arrays as array_actions
from jobs.auth import ConsoleSession, UserToken
from jobs.models import JobArray
from jobs.reads import arrays
from jobs.schemas import ArrayIn, ErrorOut, Text

router = Router(auth=[UserToken(), ConsoleSession()], tags=["arrays"])
# `array_actions.ARRAY_VERBS`, spelled out for the schema (tests/actions/test_array_verbs.py).
Verb = Literal["stop", "pause", "resume", "retry"]


class ArrayOut(Schema):
    id: int
    name: str
    team: str
    user: str
    spec: str = Field(description='the --array indices, or "file" for --array-file')
    size: int
    max_parallel: int | None
    created_at: dt.datetime
    counts: dict[str, int] = Field(description="tasks per state (states with none left out)")
    summary: str = Field(description='e.g. "3 RUNNING, 5 QUEUED, 24 SUCCEEDED"')


class TaskOut(Schema):
    id: int
    index: int
    params: dict[str, Any] | None
    status: str
    reason: str = Field(description="the first line of the task's status reason")
    attempt: int
    retry_count: int
    latest: dict[str, float] = Field(description="latest value of the array's first metrics")


class ArrayDetailOut(ArrayOut):
    metrics: list[str] = Field(description="the metrics `latest` shows, by name")
    tasks: list[TaskOut] = Field(description=f"by index, the first {arrays.TASKS_SHOWN}")


class ListQuery(Schema):
    limit: int = Field(50, ge=1, le=500)
    team: Text | None = Field(None, max_length=50, description="only this team's arrays")
    user: Text | None = Field(None, max_length=150, description="only this user's arrays")
    mine: bool = Field(False, description="only my arrays")


class ActIn(Schema):
    failed: bool = Field(False, description="retry: only the FAILED tasks")


class ActedOut(Schema):
    array: int
    verb: str
    acted: int = Field(description="tasks the verb moved")
    left: int = Field(description="tasks it did not apply to (their state does not allow it)")
    counts: dict[str, int]


def array_out(array: JobArray, by_state: dict[str, int]) -> dict:
    return {
        "id": array.pk,
        "name": array.name,
        "team": array.team.name,
        "user": array.user.username,
        "spec": array.spec,
        "size": array.size,
        "max_parallel": array.max_parallel,
        "created_at": array.created_at,
        "counts": by_state,
        "summary": arrays.summary(by_state),
    }


def array_detail(array: JobArray) -> dict:
    names, rows = arrays.task_rows(array)
    by_state = arrays.counts([array.pk])[array.pk]
    return {**array_out(array, by_state), "metrics": names, "tasks": rows}


@router.post(
    "/arrays",
    response={201: ArrayOut, (400, 401, 403, 404, 422, 429): ErrorOut},
    summary="Submit a job array: one job's fields, N tasks",
)
def submit_array(request, body: ArrayIn):
    array = array_actions.submit_array(request.auth, body)
    return Status(201, array_out(array, arrays.counts([array.pk])[array.pk]))


@router.get(
    "/arrays",
    response={200: list[ArrayOut], (401, 422, 429): ErrorOut},
    summary="The latest arrays of my teams, with their counts",
)
def list_arrays(request, query: Query[ListQuery]):
    chosen = arrays.visible_arrays(request.auth)
    if query.team:
        chosen = chosen.filter(team__name=query.team)
    if query.mine:
        chosen = chosen.filter(user=request.auth)
    elif query.user:
        chosen = chosen.filter(user__username=query.user)
    found = list(chosen[: query.limit])
    by_array = arrays.counts([a.pk for a in found])
    return [array_out(a, by_array[a.pk]) for a in found]


@router.get(
    "/arrays/{array_id}",
    response={200: ArrayDetailOut, (401, 404, 422, 429): ErrorOut},
    summary="One array: its counts and its tasks with their latest metric values",
)
def get_array(request, array_id: int):
    return array_detail(arrays.get_visible_array(request.auth, array_id))


@router.post(
    "/arrays/{array_id}/{verb}",
    response={200: ActedOut, (400, 401, 403, 404, 409, 422, 429): ErrorOut},
    summary="Stop, pause, resume or retry every task of an array that allows it",
)
def act_on_array(request, array_id: int, verb: Verb, body: ActIn | None = None):
    failed = body.failed if body is not None else False
    return array_actions.act(request.auth, array_id, verb, failed_only=failed)
