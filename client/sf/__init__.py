"""Starforge client package: the `sf` CLI, the job-side runner, and (later) the in-job SDK.

Kept import-free on purpose: `sf --help` and the runner start-up time depend on it.
"""

__version__ = "0.1.0"
