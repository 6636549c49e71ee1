"""A no-op executor for benchmarks: accepts every launch and reports it PENDING forever."""

from typing import ClassVar

from jobs.executors.base import (
    Capacity,
    LaunchSpec,
    NodeCapacity,
    Observation,
    check_int,
    check_known,
)
from jobs.states import JobStatus


class NoopExecutor:
    STATE_TABLE: ClassVar[dict[str, JobStatus]] = {"ACCEPTED": JobStatus.PENDING}
    PREEMPT_BY_TERM: ClassVar[bool] = False

    @staticmethod
    def validate_settings(settings: dict) -> None:
        check_known(settings, {"gpus", "nodes", "gpu_type"})
        check_int(settings, "gpus", minimum=0)
        check_int(settings, "nodes", minimum=1)
        if not isinstance(settings.get("gpu_type", ""), str):
            raise ValueError("gpu_type must be a string")

    def __init__(self, cluster) -> None:
        self.total_gpus = int(cluster.settings.get("gpus", 1_000_000))
        # With `nodes`, the GPUs are that many nodes of gpus / nodes each (the gang benchmark).
        count = int(cluster.settings.get("nodes", 0))
        kind = str(cluster.settings.get("gpu_type", ""))
        self.nodes = tuple(
            NodeCapacity(f"noop-{i}", self.total_gpus // count, kind) for i in range(count)
        )

    def submit(self, spec: LaunchSpec) -> str:
        return f"noop:{spec.name}"

    def find(self, name: str) -> str | None:
        return None

    def poll(self, job_refs: list[str]) -> dict[str, Observation]:
        return {ref: Observation("ACCEPTED") for ref in job_refs}

    def reap_stale(self, observations: dict[str, Observation]) -> list[str]:
        return []  # a poll marks nothing

    def cancel(self, job_ref: str) -> None:
        return None

    def starforge_objects(self) -> dict[str, Observation]:
        return {}  # it keeps nothing: every poll answers from the refs it is given

    def capacity(self) -> Capacity:
        return Capacity(reachable=True, total_gpus=self.total_gpus, virtual=True, nodes=self.nodes)
