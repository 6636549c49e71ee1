"""Starforge client package: the `sf` CLI, the job-side runner, and the in-job metrics SDK.

Kept import-free on purpose: `sf --help` and the runner start-up time depend on it. The SDK
(`sf.log`, `sf.log_validation`) lives in `sf.metrics` and is imported on first use.
"""

from typing import Any

__version__ = "0.1.0"
_SDK = ("log", "log_validation")


def __getattr__(name: str) -> Any:
    if name in _SDK:
        from sf import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module 'sf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*globals(), *_SDK]
