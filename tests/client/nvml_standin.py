"""A pynvml stand-in for the activity sampler's tests: no GPU exists on these machines, so the
NVML path is tested against this module put in sys.modules (README's list of mocked parts).
Device d reads the utilisation given for it, 1 GiB used, 70 W."""

import types


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def standin(utils: list[float]) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.NVML_ERROR_NOT_SUPPORTED = 3  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(utils)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=utils[h])  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2**30)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetPowerUsage = lambda h: 70_000  # type: ignore[attr-defined]
    return nvml
