"""Owns how the runner's own messages read: one line on stderr, `sf.runner: ...`, flushed at
once. Whatever keeps the runner's stderr has them (the local executor: runner.log), and the
executors find an ingest failure's sentence there by its words (`sf.contract.INGEST_FAILED`)."""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """One line of the runner's own, beside (never inside) the job's output."""
    sys.stderr.write(f"sf.runner: {message}\n")
    sys.stderr.flush()
