"""Executors: one module per backend behind the interface in `jobs.executors.base`."""

from jobs.executors.base import (
    Capacity,
    Executor,
    LaunchError,
    LaunchSpec,
    Observation,
    executor_for,
    override,
)

__all__ = [
    "Capacity",
    "Executor",
    "LaunchError",
    "LaunchSpec",
    "Observation",
    "executor_for",
    "override",
]
