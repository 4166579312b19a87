"""A fake of NVML at its boundary: the pynvml calls jaxmem makes, answered from a script.

Only the pynvml module's functions are replaced (monkeypatch); everything of jaxmem's own
runs as it does on a GPU machine.
"""

from __future__ import annotations

import types

import pynvml

GiB = 1 << 30


class FakeNvml:
    def __init__(self, gpus=None, driver="575.57.08", init_error=None, pid=None):
        # one dict per GPU; list-valued readings are played in order (the last one repeats)
        self.gpus = gpus if gpus is not None else [dict(name="NVIDIA H100 80GB HBM3", cc=(9, 0), total=80 * GiB)]
        self.driver = driver
        self.init_error = init_error          # an NVML_ERROR_* code nvmlInit fails with
        self.pid = pid
        self.calls = {"init": 0, "shutdown": 0}
        self._pos: dict = {}

    def install(self, monkeypatch):
        for name in ("nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount",
                     "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetName",
                     "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates",
                     "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons",
                     "nvmlDeviceGetComputeRunningProcesses"):
            monkeypatch.setattr(pynvml, name, getattr(self, name))
        return self

    def _play(self, i, key, default=None):
        v = self.gpus[i].get(key, default)
        if isinstance(v, Exception):
            raise v
        if not isinstance(v, list):
            return v
        pos = self._pos.get((i, key), 0)
        self._pos[(i, key)] = pos + 1
        item = v[min(pos, len(v) - 1)]
        if isinstance(item, Exception):
            raise item
        return item

    # --- the NVML API (pynvml's signatures)
    def nvmlInit(self):
        self.calls["init"] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.calls["shutdown"] += 1

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for i, g in enumerate(self.gpus):
            if g.get("uuid") == uuid:
                return i
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, h):
        return self.gpus[h]["name"]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.gpus[h]["cc"]

    def nvmlDeviceGetMemoryInfo(self, h):
        total = self.gpus[h]["total"]
        used = self._play(h, "used", 0)
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self._play(h, "util", 0), memory=0)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._play(h, "power_mw", 100_000)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._play(h, "temp", 40)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._play(h, "reasons", 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.gpus[h].get("procs", [])]
