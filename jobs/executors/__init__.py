"""Executors: one module per backend behind the interface in `jobs.executors.base`."""

from jobs.executors.base import (
    Capacity,
    Executor,
    LaunchError,
    LaunchSpec,
    NodeCapacity,
    Observation,
    executor_for,
    gpu_type_matches,
    override,
)

__all__ = [
    "Capacity",
    "Executor",
    "LaunchError",
    "LaunchSpec",
    "NodeCapacity",
    "Observation",
    "executor_for",
    "gpu_type_matches",
    "override",
]
