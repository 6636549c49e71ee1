"""Owns the runner's system sampler: the job's CPU and memory, and NVML GPU telemetry.

Every SF_SYSTEM_SAMPLE_S seconds the sampler hands the runner metric points of kind "system":
`cpu_percent` (the entrypoint's process group, 100 per busy core) and `memory_mib` (the group's
resident memory) read from /proc, and per GPU visible to the job `gpu{i}_util_percent`,
`gpu{i}_memory_mib` and `gpu{i}_power_w` read through NVML (the nvidia-ml-py package's
`pynvml`), where `i` is the device's index as the job sees it (cuda:i). One point
`nvml_available` (1.0 or 0.0) is recorded at start, so the console can tell "no GPU telemetry"
from "not sampled yet". A reading that fails is skipped, never replaced by a made-up number.

Each sample's readings also go to `observe` where given: the runner's activity counts
(`sf.activity`), from which the server tells active GPU-time from idle and a hang.

Standard library only, with pynvml optional: without it, or without a driver, there is simply
no GPU telemetry. Any unexpected NVML error stops GPU sampling; CPU and memory go on.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sf.contract import SYSTEM_SAMPLE_VAR
from sf.say import say

DEFAULT_INTERVAL_S = 5.0
MIN_INTERVAL_S = 0.05
STOP_TIMEOUT_S = 10.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

Point = dict[str, Any]


def sample_interval(environ: dict[str, str] | os._Environ) -> float:
    """SF_SYSTEM_SAMPLE_S as seconds (default 5); an unusable value falls back to the default."""
    raw = environ.get(SYSTEM_SAMPLE_VAR, "")
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        say(f"{SYSTEM_SAMPLE_VAR}={raw!r} is not a positive number; sampling every 5s")
        return DEFAULT_INTERVAL_S
    return max(value, MIN_INTERVAL_S)


# --- the process group, from /proc ------------------------------------------------------


def proc_stats() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name) of every process that can
    still be read; the first field is the state (`man 5 proc` numbers them from 3)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue  # gone meanwhile, or unreadable
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        yield int(entry), raw[raw.rfind(b")") + 2 :].split()


def group_usage(pgid: int) -> tuple[dict[tuple[int, int], int], float | None]:
    """The group's processes as {(pid, start time): CPU ticks}, and its resident MiB.

    The memory is None when no process of the group had a VmRSS to read (all gone or zombies).
    """
    ticks: dict[tuple[int, int], int] = {}
    rss_kib, rss_seen = 0, False
    for pid, fields in proc_stats():
        try:
            if int(fields[2]) != pgid:  # pgrp
                continue
            ticks[(pid, int(fields[19]))] = int(fields[11]) + int(fields[12])  # utime+stime
        except (ValueError, IndexError):
            continue
        rss = _vm_rss_kib(str(pid))
        if rss is not None:
            rss_kib += rss
            rss_seen = True
    return ticks, (rss_kib / 1024 if rss_seen else None)


def _vm_rss_kib(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None  # kernel threads and zombies have none


def cpu_percent(
    before: dict[tuple[int, int], int], after: dict[tuple[int, int], int], wall_s: float
) -> float:
    """CPU used between two readings, in percent of one core (2 busy cores = 200).

    A process started since `before` counts all its time; one that ended in between is not
    seen, so the figure can be low but never invents time.
    """
    used = sum(max(0, t - before.get(key, 0)) for key, t in after.items())
    return used / CLOCK_TICKS / wall_s * 100


# --- GPUs, through NVML -----------------------------------------------------------------


def _util(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)


def _memory(nvml: Any, handle: Any) -> float:
    return nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20


def _power(nvml: Any, handle: Any) -> float:
    return nvml.nvmlDeviceGetPowerUsage(handle) / 1000  # milliwatts


READINGS: tuple[tuple[str, Callable[[Any, Any], float]], ...] = (
    ("util_percent", _util),
    ("memory_mib", _memory),
    ("power_w", _power),
)


class Gpus:
    """NVML handles of the GPUs the job may use; none when NVML cannot be loaded or started."""

    def __init__(self, visible: str | None) -> None:
        self.nvml: Any = None
        self.handles: list[Any] = []
        self.unsupported: set[tuple[int, str]] = set()
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no package, no driver, no device: no GPU telemetry
            return
        try:
            self.handles = visible_handles(pynvml, visible)
        except Exception as exc:  # noqa: BLE001 - any NVML failure
            say(f"no GPU telemetry: NVML could not list the job's GPUs: {exc}")
            _shutdown(pynvml)
            return
        self.nvml = pynvml

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def read(self) -> list[tuple[str, float]]:
        """Each GPU's readings; one that NVML does not support is skipped from then on.

        Any other error is raised: the caller stops GPU sampling.
        """
        out = []
        not_supported = getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
        for index, handle in enumerate(self.handles):
            for metric, read in READINGS:
                if (index, metric) in self.unsupported:
                    continue
                try:
                    value = float(read(self.nvml, handle))
                except self.nvml.NVMLError as exc:
                    if getattr(exc, "value", None) != not_supported:
                        raise
                    self.unsupported.add((index, metric))
                    continue
                if math.isfinite(value):
                    out.append((f"gpu{index}_{metric}", value))
        return out

    def close(self) -> None:
        if self.nvml is not None:
            _shutdown(self.nvml)
        self.nvml, self.handles = None, []


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001, S110 - nothing left to do with a broken NVML
        pass


def visible_handles(nvml: Any, visible: str | None) -> list[Any]:
    """NVML handles for CUDA_VISIBLE_DEVICES, in the job's order (unset: every device).

    Entries are indices or GPU-/MIG- UUIDs; like CUDA, an invalid entry hides it and the rest.
    """
    count = nvml.nvmlDeviceGetCount()
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for item in (part.strip() for part in visible.split(",")):
        if item.isdigit() and int(item) < count:
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(item)))
        elif item.startswith(("GPU-", "MIG-")):
            try:
                handles.append(nvml.nvmlDeviceGetHandleByUUID(item))
            except nvml.NVMLError:
                break
        else:
            break
    return handles


# --- the sampler thread -----------------------------------------------------------------


class SystemSampler:
    """Samples the process group `pgid` into `record` (one point dict at a time) until stopped.

    Step 0 is the `nvml_available` point; samples are steps 1, 2, ... The first CPU figure
    covers the time from the sampler's start to the first sample. A rank of a multi-node job
    names its series with a prefix (`rank1/cpu_percent`), so the System tab shows each node.
    """

    def __init__(
        self,
        pgid: int,
        record: Callable[[Point], None],
        interval: float,
        visible_gpus: str | None,
        prefix: str = "",
        observe: Callable[[list[tuple[str, float]], float], None] | None = None,
    ) -> None:
        self.pgid, self.sink, self.interval = pgid, record, interval
        self.prefix = prefix
        self.observe = observe  # each sample's readings and the seconds they cover: activity
        self.visible_gpus = visible_gpus
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="sf-system", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop sampling; nothing is recorded after this returns."""
        self.done.set()
        self.thread.join(STOP_TIMEOUT_S)
        with self.lock:
            self.closed = True

    def _record(self, step: int, readings: list[tuple[str, float]]) -> None:
        ts = time.time()
        with self.lock:
            if self.closed:
                return
            for name, value in readings:
                name = self.prefix + name
                self.sink({"kind": "system", "name": name, "step": step, "value": value, "ts": ts})

    def _loop(self) -> None:
        gpus = None
        try:
            gpus = Gpus(self.visible_gpus)
            self._record(0, [("nvml_available", 1.0 if gpus.available else 0.0)])
            before, _ = group_usage(self.pgid)
            then = time.monotonic()
            step = 0
            while not self.done.wait(self.interval):
                step += 1
                after, memory = group_usage(self.pgid)
                now = time.monotonic()
                readings = []
                if after:  # an empty group has ended: nothing to say about it
                    readings.append(("cpu_percent", cpu_percent(before, after, now - then)))
                if memory is not None:
                    readings.append(("memory_mib", memory))
                readings += self._gpu_readings(gpus)
                if self.observe is not None:
                    self.observe(readings, now - then)
                before, then = after, now
                self._record(step, readings)
        except Exception as exc:  # noqa: BLE001 - the sampler must never take the runner down
            say(f"system sampling stopped: {exc!r}")
        finally:
            if gpus is not None:
                gpus.close()

    def _gpu_readings(self, gpus: Gpus) -> list[tuple[str, float]]:
        if not gpus.available:
            return []
        try:
            return gpus.read()
        except Exception as exc:  # noqa: BLE001 - any NVML failure
            say(f"GPU sampling stopped after an NVML error: {exc!r}; CPU and memory go on")
            gpus.close()
            return []
