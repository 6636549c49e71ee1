"""API schemas: explicit fields in and out, and what text and JSON a request may hand on.

Text a request sends may end up in a job's argv, its environment, a file name or a ledger
column; `text_fault` and `json_fault` are the one place that says which may not, and every
string field in (`Text`) and the array file's parameter sets (`jobs.actions.arrays`) use them.
"""

import datetime as dt
import math
import re
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, Field, StringConstraints, model_validator
from sf.contract import Failure

from jobs.models import TIME_LIMIT_MAX_S

LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def text_fault(value: str) -> str | None:
    """Why `value` may not reach an argv, an environment, a file name or the ledger; None if
    it may. NUL ends a C string (execve, setenv, open) and PostgreSQL text cannot hold it; a
    lone surrogate (an unpaired JSON escape such as "\\ud800") is no character at all, so it has
    no UTF-8 for the database, a file system or the runner's exec."""
    if "\x00" in value:
        return "must not contain NUL characters"
    if LONE_SURROGATE.search(value):
        return "must not contain lone surrogates (an unpaired \\ud800-\\udfff escape)"
    return None


def json_fault(value: object) -> str | None:
    """Why a JSON value may not be kept and handed to a job, naming where in it (`lr`,
    `grid[2].name`); None if it may. Its strings, names included, as `text_fault`; its numbers
    finite: NaN and Infinity (1e400 parses as Infinity) are JSON that neither PostgreSQL, nor
    SQLite, nor the runner's parser accepts. Walked without recursion, so no depth can fail it."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        fault = None
        if isinstance(item, str):
            fault = text_fault(item)
        elif isinstance(item, float) and not math.isfinite(item):
            fault = "must be a finite number (NaN, Infinity and numbers past 1.8e308 are not)"
        elif isinstance(item, dict):
            for name, inner in item.items():
                if name_fault := text_fault(name):
                    return f"a name{' in ' + path if path else ''} {name_fault}"
                stack.append((f"{path}.{name}" if path else name, inner))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", inner) for i, inner in enumerate(item))
        if fault:
            return f"{path or 'the value'} {fault}"
    return None


def _plain_text(value: str) -> str:
    if fault := text_fault(value):
        raise ValueError(fault)
    return value


Text = Annotated[str, AfterValidator(_plain_text)]
NonEmpty = Annotated[Text, StringConstraints(min_length=1, max_length=4096)]


class JobIn(Schema):
    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        body = getattr(data, "_obj", data)  # ninja hands validators its DjangoGetter wrapper
        if isinstance(body, list | str | int | float | bool) or body is None:
            raise ValueError("the body must be a JSON object with at least an entrypoint")
        return data

    entrypoint: list[NonEmpty] = Field(
        ...,
        min_length=1,
        max_length=1000,
        description="argv of the command to run, e.g. ['python', 'train.py']",
    )
    snapshot: Text | None = Field(
        None, max_length=64, description="sha256 of an uploaded working-directory snapshot"
    )
    # Strict: a JSON boolean or string is a client bug, not a count. Two names for one count:
    # `gpus` is the name /api/v1 gave it first, kept so that every body it took still works;
    # both at once must agree (`jobs.actions.submit.prepare` says which one counts).
    gpus_per_node: int = Field(
        1, ge=0, le=1024, strict=True, description="GPUs each node (each rank) gets (default 1)"
    )
    gpus: int = Field(
        1,
        ge=0,
        le=1024,
        strict=True,
        description="the same as gpus_per_node, under its first name (per node, not in all; "
        "an answer's `gpus` is in all); give either, or both alike",
    )
    nodes: int = Field(
        1, ge=1, le=256, strict=True, description="ranks, each on its own node, started at once"
    )
    gpu_type: Text | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="GPU type every node must have, e.g. a100 (default: any)",
    )
    cpus: int | None = Field(None, ge=1, le=4096, strict=True, description="CPUs per node")
    memory: Text | None = Field(
        None, max_length=20, description="memory per node, e.g. 64G, 512M, 1.5T (binary units)"
    )
    image: Text | None = Field(
        None, min_length=1, max_length=300, description="container image (Kubernetes only)"
    )
    cluster: Text | None = Field(None, max_length=50)
    team: Text | None = Field(None, max_length=50)
    name: Text | None = Field(None, max_length=200)
    env: dict[Text, Annotated[Text, StringConstraints(max_length=65536)]] = Field(
        default_factory=dict
    )
    priority: int = Field(0, ge=-100, le=100, strict=True)
    window: Text | None = Field(None, max_length=50)
    window_policy: Literal["wait", "pause"] = Field(
        "wait",
        description="wait: start only inside the window; pause: also pause the job when its "
        "window closes and resume it when it reopens",
    )
    pending_deadline_s: int | None = Field(None, ge=1, le=7 * 24 * 3600, strict=True)
    time_limit_s: int | None = Field(
        None,
        ge=1,
        le=TIME_LIMIT_MAX_S,
        strict=True,
        description="seconds each attempt may run once it is up; past it the job is stopped "
        "(default: the team's)",
    )
    max_retries: int | None = Field(
        None, ge=0, le=100, strict=True, description="automatic retries (default: the team's)"
    )
    retry_cooldown_s: int | None = Field(
        None,
        ge=0,
        le=24 * 3600,
        strict=True,
        description="seconds before the first automatic retry; doubles each retry",
    )
    then: list[Annotated[Text, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,50}$")]] = Field(
        default_factory=list,
        max_length=10,
        description="follow-on jobs from starforge.toml [then.<name>], run when this succeeds",
    )

    @model_validator(mode="after")
    def _distinct_follow_ons(self) -> "JobIn":
        if len(set(self.then)) != len(self.then):
            raise ValueError("each --then name may be given once")
        return self


class ArrayIn(JobIn):
    """A job array: the job's fields once, and its tasks as `array` or `array_params`."""

    array: Text | None = Field(
        None, max_length=1000, description='indices and ranges, e.g. "0-31", "0-31:4", "1,3,5"'
    )
    # Items are checked by `jobs.actions.arrays.check_params`, whose sentence names the line.
    array_params: list[Any] | None = Field(
        None,
        max_length=10_000,
        description="one parameter set per task (the array file's lines); task i gets set i",
    )
    max_parallel: int | None = Field(
        None, ge=1, strict=True, description="tasks active at once (default: no cap)"
    )


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
    total_gpus: int = Field(description="GPUs the job holds in all: nodes x gpus_per_node")
    gpus: int = Field(description="the same as total_gpus, under its first name in /api/v1")
    nodes: int
    gpus_per_node: int = Field(description="GPUs each node (each rank) gets")
    gpu_type: str = Field(description="the GPU type asked for; empty: any")
    cpus: int | None = Field(description="CPUs per node asked for")
    memory_mb: int | None = Field(description="MiB per node asked for")
    image: str
    ranks: list["RankOut"] = Field(description="the current attempt's ranks, as last reported")
    virtual_gpus: bool
    entrypoint: list[str]
    priority: int
    window: str | None
    window_policy: str
    attempt: int
    retry_count: int
    job_ref: str
    submitted_at: dt.datetime
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    exit_code: int | None
    gpu_seconds: float
    cost: str = Field(
        description="what its attempts cost at the GPU prices in force when they ran, a "
        "decimal string in `currency` (never a float)"
    )
    currency: str
    active_gpu_seconds: float = Field(
        description="the current attempt's GPU-seconds with its GPUs working (utilisation at the "
        "threshold, or without GPU readings its ranks progressing), by the runner's reports"
    )
    idle_gpu_seconds: float = Field(description="the current attempt's GPU-seconds idle")
    efficiency: float | None = Field(
        description="active ÷ billed GPU-seconds of the current attempt; null before it started"
    )
    output_dir: str
    snapshot: str | None
    max_retries: int
    retries_left: int
    retry_cooldown_s: int
    time_limit_s: int | None = Field(description="seconds each attempt may run; null: no limit")
    next_attempt_at: dt.datetime | None = Field(description="when a pending automatic retry starts")
    retry_available: bool
    retry_unavailable_reason: str
    parent: int | None
    follow_on_name: str
    then: list[str]
    queue_position: int | None = Field(
        description="QUEUED: its place among the jobs waiting on its cluster, in the order the "
        "scheduler considers them (1: next); null otherwise or before the next tick"
    )
    team_queue_position: int | None = Field(description="its place among its team's waiting jobs")
    ahead: list["AheadOut"] = Field(description="the nearest jobs waiting ahead of it (up to 5)")
    ahead_jobs: int | None = Field(description="how many jobs wait ahead of it on its cluster")
    ahead_gpus: int | None = Field(description="the GPUs those jobs ask for")
    estimated_start: dt.datetime | None = Field(
        description="when it can start at the latest if running jobs run to their time limits "
        "and nothing is submitted ahead of it; null with estimate_reason when none can be given"
    )
    estimate_reason: str = Field(description="why there is no estimate; empty when there is one")
    planned_at: dt.datetime | None = Field(description="when the scheduler made this plan")
    borrowed: bool = Field(
        description="its GPUs are borrowed from another team's idle quota while it holds them "
        "(it is preemptible then); false: its own team's quota"
    )
    borrowed_from: str | None = Field(
        description="the team it borrows from, for staff only: null for everyone else, since "
        "no team learns another's figures (who lent, their quota and holdings)"
    )
    preempted_at: dt.datetime | None = Field(
        description="when it was told to give its borrowed GPUs back (SIGTERM and its notice); "
        "null unless that is under way"
    )
    preempt_kill_at: dt.datetime | None = Field(
        description="when SIGKILL follows unless it exits first (its cluster's grace later)"
    )
    array: int | None = Field(None, description="the job array it is a task of, if any")
    array_index: int | None = Field(None, description="its index in that array")


class AheadOut(Schema):
    id: int | None = Field(description="the job's id; null for another team's job")
    same_team: bool
    total_gpus: int = Field(description="the GPUs it asks for in all")
    gpus: int = Field(description="the same as total_gpus, under its first name in /api/v1")


class RankOut(Schema):
    rank: int
    node: str = Field(description="the node the rank runs on, as the engine names it")
    state: str = Field(description="pending, running, succeeded, failed or killed")
    exit_code: int | None


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


# An attempt's failure as the API answers it: one of the causes the ledger keeps.
FAILURES = ", ".join(Failure.recorded()[:-1]) + f" or {Failure.recorded()[-1]}"


class AttemptOut(Schema):
    number: int
    backend_name: str
    job_ref: str
    total_gpus: int = Field(description="GPUs the attempt holds in all: nodes x GPUs per node")
    gpus: int = Field(description="the same as total_gpus, under its first name in /api/v1")
    nodes: int
    ranks: list[RankOut]
    submitted_at: dt.datetime
    pending_at: dt.datetime | None
    start_time: dt.datetime | None = Field(description="billed start")
    end_time: dt.datetime | None = Field(description="billed end")
    engine_start: dt.datetime | None = Field(
        description="the engine's own start (Slurm's Start...), where it reported one"
    )
    engine_end: dt.datetime | None = Field(
        description="the engine's own end; the billed times never leave the engine's"
    )
    exit_code: int | None
    end_reason: str
    failure: str = Field(description=FAILURES)
    native_state: str = Field(description="the backend's own state, as last observed")
    native_message: str = Field(description="the backend's words for why it waits")
    gpu_seconds: float
    cost: str = Field(description="at the GPU prices in force when it ran (a decimal string)")
    cost_split: str = Field(
        description="where the price changed while it ran, the prices it was billed at; else empty"
    )


class StartedOut(Schema):
    start_time: dt.datetime | None


class CheckpointOut(Schema):
    checkpoint_at: dt.datetime | None


class TokenExchangeOut(Schema):
    token: str = Field(description="the job token; the bootstrap credential is now spent")


class DiagnosticsOut(Schema):
    status: str
    sentences: list[str]


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
    dropped: int = 0  # lines past the attempt's log cap (SF_ATTEMPT_MAX_LOG_MB), not stored


class ErrorOut(Schema):
    """Every 4xx answer: a sentence, and what else the refusal knows.

    Each route lists the codes it may answer with in its `response=`, e.g.
    `{200: JobOut, (401, 404, 422, 429): ErrorOut}`: 401 for a missing, unknown, revoked or
    expired token, 422 for an invalid parameter or body field, 429 for an address that sent too
    many unknown tokens lately.
    """

    detail: str = Field(description="what is wrong, in a sentence")
    status: str | None = Field(None, description="the job's status, when it refused a verb")
    next_seq: int | None = Field(None, description="the log line the server expects next")
    errors: list[dict] | None = Field(None, description="each invalid field, on a 422")
    retry_after: int | None = Field(None, description="seconds until a 429 ends")
