"""The runner's activity reports (sf.activity): what the samplers, the line sink and the
metrics shipper count per rank, the reports posted each period, and the py-spy dumps sent when
the server's answer asks for them. NVML is a stand-in (tests/client/nvml_standin.py): no GPU
exists on these machines."""

from __future__ import annotations

import functools
import io
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from sf import activity, system
from sf.http import Client
from sf.shipping import BatchShipper

from tests.client.nvml_standin import standin

BUSY = "import time\nend = time.time() + 1.5\nwhile time.time() < end:\n    pass\n"
WAITS = (
    "import time\n"
    "def wait_for_the_other_side():\n"
    "    while True:\n"
    "        time.sleep(0.2)\n"
    "print('ready', flush=True)\n"
    "wait_for_the_other_side()\n"
)


def test_the_sampler_hands_gpu_utilisation_and_cpu_time_to_the_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", standin([80.0, 3.0]))
    counts = activity.ActivityCounts()
    child = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    sampler = system.SystemSampler(
        child.pid, lambda _p: None, 0.2, None, observe=functools.partial(counts.sampled, 0)
    )
    sampler.start()
    child.wait()
    sampler.stop()
    (rank,) = counts.take([0])["ranks"]
    assert rank["gpu_util"] == [80.0, 3.0]  # each GPU's highest of the period
    assert rank["cpu_s"] > 0.5  # a busy core for 1.5 s, less the sampler's start
    assert counts.take([0])["ranks"][0]["cpu_s"] is None  # counting starts again


class Nowhere(BatchShipper):
    def __init__(self) -> None:
        super().__init__(None, 1)

    def add(self, record: dict) -> None:
        pass


def test_lines_count_per_rank_and_the_jobs_metric_points_per_attempt() -> None:
    counts = activity.ActivityCounts()
    sink = activity.CountingLineSink(io.StringIO(), Nowhere(), ranked=True, counts=counts)
    for rank in (0, 1, 1):
        sink.emit("stdout", "a line", rank)
    shipper = activity.CountingMetricsShipper(None, 1, counts=counts)
    shipper.add({"kind": "train", "name": "loss", "step": 1, "value": 0.5, "ts": 0, "seq": 0})
    shipper.add({"kind": "system", "name": "cpu_percent", "step": 1, "value": 9, "ts": 0, "seq": 1})
    taken = counts.take([0, 1])
    assert taken["steps"] == 1  # the runner's own system points are no progress
    assert [r["lines"] for r in taken["ranks"]] == [1, 2]


def test_a_dump_names_the_function_a_rank_waits_in() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WAITS], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        child.stdout.readline()  # type: ignore[union-attr]
        (dump,) = activity.rank_dumps({3: child.pid}, activity.py_spy())
    finally:
        child.kill()
        child.wait()
    assert dump["rank"] == 3 and "wait_for_the_other_side (<string>" in dump["text"], dump


def test_without_py_spy_the_dump_says_so() -> None:
    assert "py-spy is not installed" in activity.dump_stacks(1, None)


def test_the_reporter_posts_each_period_and_dumps_when_the_answer_asks(fake_api: Any) -> None:
    reports: list[dict] = []
    dumps: list[dict] = []
    got_dump = threading.Event()

    def on_report(request: Any) -> tuple[int, dict]:
        reports.append(request.json())
        return 200, {"dump": len(reports) == 2}

    def on_dumps(request: Any) -> tuple[int, dict]:
        dumps.append(request.json())
        got_dump.set()
        return 200, {"kept": 1}

    fake_api.route("POST /api/v1/ingest/activity", on_report)
    fake_api.route("POST /api/v1/ingest/dumps", on_dumps)
    child = subprocess.Popen([sys.executable, "-c", WAITS], start_new_session=True)
    counts = activity.ActivityCounts()
    counts.line(0)
    reporter = activity.ActivityReporter(
        Client(fake_api.url, "tok"), 7, counts, 0.1, {0: child.pid}, [0]
    )
    try:
        reporter.start()
        assert got_dump.wait(20)
        time.sleep(0.3)
    finally:
        reporter.stop()
        child.kill()
        child.wait()
    assert reports[0]["attempt"] == 7 and reports[0]["ranks"][0]["lines"] == 1
    assert reports[1]["ranks"][0]["lines"] == 0  # each report: what happened since the last
    (sent,) = dumps
    assert sent["attempt"] == 7 and sent["dumps"][0]["rank"] == 0
