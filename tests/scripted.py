"""A scripted executor: a test double of a backend whose native states the test sets."""

from typing import ClassVar

from jobs.executors import Capacity, LaunchError, Observation
from jobs.states import JobStatus

S = JobStatus


class ScriptedExecutor:
    STATE_TABLE: ClassVar[dict[str, JobStatus]] = {
        "QUEUED": S.PENDING,
        "RUN": S.RUNNING,
        "OK": S.SUCCEEDED,
        "BAD": S.FAILED,
        "HALTED": S.STOPPED,  # stopped on the engine, not through Starforge
    }

    def __init__(self) -> None:
        self.states: dict[str, Observation] = {}
        self.existing: set[str] = set()
        self.submitted: list[str] = []
        self.cancelled: list[str] = []
        self.poll_error: Exception | None = None
        self.launch_error: LaunchError | None = None

    def __call__(self, cluster):  # stands in for executor_for(cluster)
        return self

    def submit(self, spec) -> str:
        if self.launch_error:
            raise self.launch_error
        self.submitted.append(spec.name)
        self.existing.add(spec.name)
        return spec.name

    def find(self, name: str) -> str | None:
        return name if name in self.existing else None

    def poll(self, refs):
        if self.poll_error:
            raise self.poll_error
        return {r: self.states[r] for r in refs if r in self.states}

    def reap_stale(self, observations: dict[str, Observation]) -> list[str]:
        return []  # its polls mark nothing

    def cancel(self, ref: str) -> None:
        self.cancelled.append(ref)

    def starforge_objects(self) -> dict[str, Observation]:
        if self.poll_error:
            raise self.poll_error
        active = (S.PENDING, S.RUNNING)
        return {r: o for r, o in self.states.items() if self.STATE_TABLE[o.native_state] in active}

    def capacity(self) -> Capacity:
        return Capacity(True, 8)
