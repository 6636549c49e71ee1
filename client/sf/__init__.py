"""Starforge client package: the `sf` CLI, the job-side runner, and the in-job metrics SDK.

Kept import-free on purpose: `sf --help` and the runner start-up time depend on it. The SDK
(`sf.log`, `sf.log_validation` in `sf.metrics`; `sf.should_checkpoint`, `sf.stop_notice`
in `sf.notice`) is imported on first use.
"""

from typing import Any

__version__ = "0.1.0"
_SDK = {
    "log": "metrics",
    "log_validation": "metrics",
    "should_checkpoint": "notice",
    "stop_notice": "notice",
}


def __getattr__(name: str) -> Any:
    if name in _SDK:
        from importlib import import_module

        return getattr(import_module(f"sf.{_SDK[name]}"), name)
    raise AttributeError(f"module 'sf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*globals(), *_SDK]
