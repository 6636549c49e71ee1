"""Owns `sf.should_checkpoint()`: whether the job has been told to stop soon (a preemption
taking its borrowed GPUs back, or a stop), so it should save a checkpoint now and exit.

The runner writes the notice to SF_NOTICE_FILE, then sends the job SIGTERM, and SIGKILL a
grace later (SF_PREEMPT_GRACE_S for a preemption). Python ends on a SIGTERM it does not
handle, so the first call here, from the main thread of a job run by Starforge, installs a
SIGTERM handler (where the program has none of its own) that only notes the notice: call it
once early, then at each step. A job resumed after a preemption starts from its checkpoint
under the same run id. Standard library only: this is imported inside arbitrary images.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

from sf.contract import NOTICE_FILE_VAR

ENV_FILE = NOTICE_FILE_VAR
_state = {"installed": False, "signalled": False}


def should_checkpoint() -> bool:
    """True once a notice has arrived: save a checkpoint and exit before its `kill_at`."""
    path = os.environ.get(ENV_FILE)
    if not path:
        return False  # not run by Starforge: nothing will tell this process to stop
    if not _state["installed"]:
        _install()
    return bool(_state["signalled"]) or os.path.exists(path)


def stop_notice() -> dict[str, Any] | None:
    """The notice as the runner wrote it: {"kind": "preempted" or "stopped", "at", "kill_at"}
    (epoch seconds), or None while there is none."""
    path = os.environ.get(ENV_FILE)
    if not path:
        return None
    try:
        with open(path) as fh:
            value = json.load(fh)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _install() -> None:
    _state["installed"] = True
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a handler; the notice file still tells
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _noted)


def _noted(_signum: int, _frame: Any) -> None:
    _state["signalled"] = True
