"""Owns the runner's activity reports: what each rank did since the last report, sent to the
server, and the stack dumps the server asks for when it suspects a hang.

Per rank the runner counts the lines it wrote (`CountingLineSink`) and, from the system
sampler (`sf.system`), the CPU seconds of its process group and each GPU's highest
utilisation; per attempt, the metric points the job logged (`CountingMetricsShipper`: the
metrics file is the attempt's, not a rank's). Every SF_SYSTEM_SAMPLE_S the reporter posts them
(`POST /api/v1/ingest/activity`) and forgets them: each report says what happened since the
previous one. The server alone decides what is idle or hung, by its own clock and the team's
policy, and answers `{"dump": true}` while it wants stacks; the reporter then runs
`py-spy dump` on every Python process of every rank it supervises and posts them (`POST
/api/v1/ingest/dumps`). Why the server asks rather than the runner deciding: the policy
(hang_after) is the team's and may change while the job runs, and the one rule is applied by
one clock; the runner needs no setting of its own.

Standard library only. py-spy is looked for beside the runner's Python, then on PATH; without
it a dump says so, and the hang is still reported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from sf.http import ApiError, Client, ConnectError
from sf.shipping import LineSink, MetricsShipper
from sf.system import proc_stats

REPORT_PATH = "/api/v1/ingest/activity"
DUMPS_PATH = "/api/v1/ingest/dumps"
DUMP_TIMEOUT_S = 15.0
DUMP_MAX_BYTES = 16 * 1024  # per process: a stack of a few hundred frames
RANK_MAX_PROCESSES = 8  # per rank: the trainer and its data loaders, not a fork bomb
STOP_TIMEOUT_S = 5.0


class ActivityCounts:
    """What each rank did since the last `take`, filled by the line sink, the metrics shipper
    and the samplers (their threads), emptied by the reporter."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lines: dict[int, int] = {}
        self.cpu_s: dict[int, float] = {}
        self.gpu_util: dict[int, list[float]] = {}
        self.steps = 0

    def line(self, rank: int) -> None:
        with self.lock:
            self.lines[rank] = self.lines.get(rank, 0) + 1

    def step(self) -> None:
        with self.lock:
            self.steps += 1

    def sampled(self, rank: int, readings: list[tuple[str, float]], wall_s: float) -> None:
        """A sampler's readings: CPU percent over `wall_s` and GPU utilisations (the highest
        of the period is kept: a GPU is idle only when it stayed under the threshold)."""
        with self.lock:
            self.cpu_s.setdefault(rank, 0.0)
            utils = self.gpu_util.setdefault(rank, [])
            for name, value in readings:
                if name == "cpu_percent":
                    self.cpu_s[rank] += value / 100 * wall_s
                elif name.startswith("gpu") and name.endswith("_util_percent"):
                    index = name[3 : -len("_util_percent")]
                    if index.isdigit():
                        _keep_max(utils, int(index), value)

    def take(self, ranks: list[int]) -> dict[str, Any]:
        """The report body's figures, and counting starts again from zero."""
        with self.lock:
            report = {
                "steps": self.steps,
                "ranks": [
                    {
                        "rank": rank,
                        "lines": self.lines.get(rank, 0),
                        "cpu_s": round(self.cpu_s[rank], 3) if rank in self.cpu_s else None,
                        "gpu_util": self.gpu_util.get(rank, []),
                    }
                    for rank in ranks
                ],
            }
            self.lines, self.cpu_s, self.gpu_util, self.steps = {}, {}, {}, 0
        return report


def _keep_max(utils: list[float], index: int, value: float) -> None:
    while len(utils) <= index:
        utils.append(0.0)
    utils[index] = max(utils[index], value)


class CountingLineSink(LineSink):
    """The runner's line sink, counting each rank's lines (a one-rank job's are rank 0's)."""

    def __init__(self, *args: Any, counts: ActivityCounts, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts = counts

    def emit(self, stream: str, text: str, rank: int | None = None) -> None:
        self.counts.line(rank or 0)
        super().emit(stream, text, rank)


class CountingMetricsShipper(MetricsShipper):
    """The metrics shipper, counting the job's own points (not the runner's system ones)."""

    def __init__(self, *args: Any, counts: ActivityCounts, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts = counts

    def add(self, record: dict) -> None:
        if record.get("kind") != "system":
            self.counts.step()
        super().add(record)


# --- stack dumps ---------------------------------------------------------------------------


def py_spy() -> str | None:
    """py-spy beside the runner's Python (the server's venv, where the runner is installed),
    else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def python_processes(pgid: int) -> list[int]:
    """The group's processes that run a Python interpreter, oldest pid first."""
    pids = []
    for pid, fields in proc_stats():
        try:
            if int(fields[2]) != pgid:
                continue
        except (ValueError, IndexError):
            continue
        if _is_python(pid):
            pids.append(pid)
    return sorted(pids)[:RANK_MAX_PROCESSES]


def _is_python(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv0 = fh.read(4096).split(b"\0", 1)[0]
    except OSError:
        return False
    return os.path.basename(argv0).startswith(b"python")


def dump_stacks(pid: int, tool: str | None, run: Callable[..., Any] = subprocess.run) -> str:
    """`py-spy dump --pid PID`, its output capped; a sentence when it cannot be had."""
    if tool is None:
        return f"pid {pid}: no stack dump: py-spy is not installed where the runner runs"
    try:
        done = run(
            [tool, "dump", "--pid", str(pid)],
            capture_output=True,
            timeout=DUMP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pid {pid}: no stack dump: {exc}"
    text = (done.stdout + done.stderr)[:DUMP_MAX_BYTES].decode("utf-8", errors="replace")
    return text if done.returncode == 0 else f"pid {pid}: py-spy failed: {text}"


def rank_dumps(groups: dict[int, int], tool: str | None) -> list[dict[str, Any]]:
    """{rank: process group} → one dump per rank: every Python process of its group."""
    out = []
    for rank, pgid in sorted(groups.items()):
        pids = python_processes(pgid)
        texts = [dump_stacks(pid, tool) for pid in pids] or [
            f"process group {pgid}: no Python process to dump"
        ]
        out.append({"rank": rank, "text": "\n".join(texts)})
    return out


# --- the reporter thread -------------------------------------------------------------------


class ActivityReporter:
    """Posts the counts every `interval` seconds; dumps the ranks' stacks when answered so."""

    def __init__(
        self,
        client: Client | None,
        attempt: int,
        counts: ActivityCounts,
        interval: float,
        groups: dict[int, int],
        ranks: list[int],
    ) -> None:
        self.client, self.attempt, self.counts = client, attempt, counts
        self.interval, self.groups = interval, groups
        self.ranks = ranks
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="sf-activity", daemon=True)

    def start(self) -> None:
        if self.client is not None:
            self.thread.start()

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(STOP_TIMEOUT_S)

    def _loop(self) -> None:
        while not self.done.wait(self.interval):
            body = {"attempt": self.attempt, **self.counts.take(self.ranks)}
            answer = self._post(REPORT_PATH, body)
            if isinstance(answer, dict) and answer.get("dump") is True and not self.done.is_set():
                dumps = rank_dumps(self.groups, py_spy())
                self._post(DUMPS_PATH, {"attempt": self.attempt, "dumps": dumps})

    def _post(self, path: str, body: dict) -> Any:
        try:
            return self.client.request("POST", path, json_body=body)  # type: ignore[union-attr]
        except (ApiError, ConnectError):
            return None  # the next report says what this one would have; the server waits
