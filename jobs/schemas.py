"""API schemas: explicit fields in and out."""

import datetime as dt
from typing import Annotated

from ninja import Schema
from pydantic import Field, StringConstraints

NonEmpty = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class JobIn(Schema):
    entrypoint: list[NonEmpty] = Field(
        ...,
        min_length=1,
        max_length=1000,
        description="argv of the command to run, e.g. ['python', 'train.py']",
    )
    snapshot: str | None = Field(
        None, description="sha256 of an uploaded working-directory snapshot"
    )
    gpus: int = Field(1, ge=0, le=1024)
    cluster: str | None = Field(None, max_length=50)
    team: str | None = Field(None, max_length=50)
    name: str | None = Field(None, max_length=200)
    env: dict[str, Annotated[str, StringConstraints(max_length=65536)]] = Field(
        default_factory=dict
    )
    priority: int = Field(0, ge=-100, le=100)
    window: str | None = Field(None, max_length=50)
    pending_deadline_s: int | None = Field(None, ge=1, le=7 * 24 * 3600)


class JobOut(Schema):
    id: int
    run_id: str
    name: str
    team: str
    user: str
    cluster: str
    backend: str
    status: str
    status_reason: str
    terminal: bool
    gpus: int
    virtual_gpus: bool
    entrypoint: list[str]
    priority: int
    window: str | None
    attempt: int
    retry_count: int
    job_ref: str
    submitted_at: dt.datetime
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    exit_code: int | None
    gpu_seconds: float
    output_dir: str
    snapshot: str | None


class JobPage(Schema):
    items: list[JobOut]
    next_before: int | None = Field(None, description="pass as `before` for the next page")


class EventOut(Schema):
    time: dt.datetime
    kind: str
    from_status: str
    to_status: str
    reason: str
    actor: str
    attempt: int | None
    data: dict


class AttemptOut(Schema):
    number: int
    backend_name: str
    job_ref: str
    gpus: int
    submitted_at: dt.datetime
    pending_at: dt.datetime | None
    start_time: dt.datetime | None
    end_time: dt.datetime | None
    exit_code: int | None
    end_reason: str
    gpu_seconds: float


class TeamOut(Schema):
    name: str
    role: str
    gpu_quota: int
    default_cluster: str | None


class MeOut(Schema):
    username: str
    teams: list[TeamOut]
    default_team: str | None


class SnapshotOut(Schema):
    sha256: str
    size: int
    created: bool


class IngestResult(Schema):
    accepted: int
    duplicates: int
    next_seq: int


class ErrorOut(Schema):
    detail: str
