"""The runner's system sampler: CPU and memory of the job's process group, NVML where it exists."""

from __future__ import annotations

import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from sf import system

from tests.client.helpers import exit_record, run_runner, runner_env

BUSY = "import time\nend = time.time() + 2.0\nwhile time.time() < end:\n    pass\n"
ALLOCATE = "import time\ndata = b'x' * (60 << 20)\ntime.sleep(2.0)\nprint(len(data))\n"
# The entrypoint only waits; the CPU is used by its child, in the same process group.
PARENT_OF_BUSY = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BUSY!r}])\n"


class PointSink:
    """Fake metrics ingest: stores points by seq, like the server's dedupe."""

    def __init__(self) -> None:
        self.stored: dict[int, dict] = {}

    def __call__(self, req: Any) -> tuple[int, Any]:
        points = req.json()["points"]
        for point in points:
            self.stored[point["seq"]] = point
        return 200, {"accepted": len(points), "duplicates": 0}

    def system(self, name: str) -> list[float]:
        return [
            p["value"]
            for _, p in sorted(self.stored.items())
            if p["kind"] == "system" and p["name"] == name
        ]


def run_job(fake_api: Any, tmp_path: Path, script: str) -> tuple[dict, PointSink]:
    sink = PointSink()
    fake_api.route("POST /api/v1/ingest/metrics", sink)
    fake_api.route("POST /api/v1/ingest/logs", lambda r: (200, {"accepted": 0, "duplicates": 0}))
    env = runner_env(tmp_path, fake_api.url, "", [sys.executable, "-c", script])
    env["SF_SYSTEM_SAMPLE_S"] = "0.2"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = run_runner(env)
    assert result.returncode == 0, result.stderr
    return env, sink


def test_busy_job_is_sampled_through_the_metrics_channel(fake_api: Any, tmp_path: Path) -> None:
    env, sink = run_job(fake_api, tmp_path, BUSY)
    assert sorted(sink.stored) == list(range(len(sink.stored)))  # one numbering, no gaps
    points = [p for p in sink.stored.values() if p["kind"] == "system"]
    assert points and all(set(p) == {"seq", "kind", "name", "step", "value", "ts"} for p in points)
    assert sink.system("nvml_available") == [0.0]  # no GPU driver on this machine
    assert not [p for p in points if p["name"].startswith("gpu")]  # nothing without NVML
    cpu = sink.system("cpu_percent")
    assert len(cpu) >= 4 and max(cpu) > 50, cpu
    steps = [p["step"] for p in points if p["name"] == "cpu_percent"]
    assert steps == list(range(1, len(steps) + 1))
    # Samples stop when the entrypoint exits: none is stamped after the exit file's end time.
    assert max(p["ts"] for p in points) <= exit_record(env)["ended_at"]
    assert all(p["ts"] >= exit_record(env)["started_at"] - 1 for p in points)


def test_allocating_job_reports_its_resident_memory(fake_api: Any, tmp_path: Path) -> None:
    _, sink = run_job(fake_api, tmp_path, ALLOCATE)
    memory = sink.system("memory_mib")
    assert memory and max(memory) >= 50, memory
    assert max(memory) < 1024


def test_cpu_of_the_whole_process_group_is_counted(fake_api: Any, tmp_path: Path) -> None:
    _, sink = run_job(fake_api, tmp_path, PARENT_OF_BUSY)
    cpu = sink.system("cpu_percent")
    assert max(cpu) > 50, cpu


def test_sampler_against_a_child_in_its_own_group() -> None:
    child = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    points: list[dict] = []
    sampler = system.SystemSampler(child.pid, points.append, 0.25, visible_gpus=None)
    sampler.start()
    child.wait()
    sampler.stop()
    count = len(points)
    time.sleep(0.4)
    assert len(points) == count  # nothing after stop()
    cpu = [p["value"] for p in points if p["name"] == "cpu_percent"]
    assert max(cpu) > 50, cpu
    assert [p for p in points if p["name"] == "nvml_available"][0]["step"] == 0


def test_interval_comes_from_the_environment() -> None:
    assert system.sample_interval({}) == 5.0
    assert system.sample_interval({"SF_SYSTEM_SAMPLE_S": "0.5"}) == 0.5
    assert system.sample_interval({"SF_SYSTEM_SAMPLE_S": "nope"}) == 5.0
    assert system.sample_interval({"SF_SYSTEM_SAMPLE_S": "-1"}) == 5.0


# -- NVML, with a stand-in module: no GPU machine here, so the real driver is untested -------------


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_pynvml(devices: int, broken_after: int | None = None) -> types.ModuleType:
    """A pynvml stand-in: device d reads util 10*d, 1 GiB used, 70 W; power unsupported on 1."""
    calls = {"util": 0}
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.NVML_ERROR_NOT_SUPPORTED = 3  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: devices  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]

    def util(handle: int) -> Any:
        calls["util"] += 1
        if broken_after is not None and calls["util"] > broken_after:
            raise NVMLError(15)  # e.g. GPU lost
        return types.SimpleNamespace(gpu=10 * handle)

    def power(handle: int) -> int:
        if handle == 1:
            raise NVMLError(3)
        return 70_000

    nvml.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2**30)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetPowerUsage = power  # type: ignore[attr-defined]
    return nvml


def test_visible_devices_map_to_the_jobs_own_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(4))
    gpus = system.Gpus("2,1")
    assert gpus.available and gpus.handles == [2, 1]
    readings = dict(gpus.read())
    assert readings == {
        "gpu0_util_percent": 20.0,
        "gpu0_memory_mib": 1024.0,
        "gpu0_power_w": 70.0,
        "gpu1_util_percent": 10.0,
        "gpu1_memory_mib": 1024.0,  # gpu1's power is not supported: skipped, not invented
    }
    assert system.Gpus("").handles == [] and system.Gpus("0,-1,3").handles == [0]
    assert system.Gpus(None).handles == [0, 1, 2, 3]


def test_an_nvml_error_stops_gpu_sampling_but_not_cpu(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(1, broken_after=1))
    child = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    points: list[dict] = []
    sampler = system.SystemSampler(child.pid, points.append, 0.2, visible_gpus="0")
    sampler.start()
    child.wait()
    sampler.stop()
    names = [p["name"] for p in points]
    assert names[0] == "nvml_available" and points[0]["value"] == 1.0
    assert names.count("gpu0_util_percent") == 1  # the first sample, then NVML broke
    assert names.count("cpu_percent") >= 4
    assert "GPU sampling stopped" in capfd.readouterr().err


def test_nvml_that_cannot_start_means_no_gpu_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_pynvml(2)

    def fail() -> None:
        raise NVMLError(9)  # driver not loaded

    nvml.nvmlInit = fail  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpus = system.Gpus(None)
    assert not gpus.available and gpus.handles == []
