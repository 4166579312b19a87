"""Watching the card while a step runs: NVML sampled on a thread (nvidia-ml-py).

:class:`Monitor` samples, for each watched GPU, utilization, memory used, power,
temperature and the clock-event (throttle) reasons, every ``interval`` seconds plus
once when it starts and once when it stops (so even a step shorter than the interval
has two samples). :meth:`Monitor.summary` gives min / median / max per metric and the
throttle reasons seen; a card that slowed its clocks for power or heat is flagged.

Also here: the NVML reads ``jaxmem calibrate`` and the GPU measurement use (memory used
on a device, and by this process), and the mapping from a CUDA ordinal to an NVML index
(NVML ignores ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

# Clock-event reasons that mean the card slowed down for power or heat (NVML's
# nvmlClocksEventReason* bits); idle, application clocks and sync boost are not throttling.
THROTTLE_REASONS = {
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
}
METRICS = ("utilization_pct", "memory_used_bytes", "power_w", "temperature_c")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (no driver, no GPU, no nvidia-ml-py)."""


def nvml():
    """The pynvml module, initialized; NvmlUnavailable when the driver's NVML cannot be loaded."""
    try:
        import pynvml  # noqa: PLC0415 - NVML loads only where a GPU is looked at
    except ImportError as e:  # nvidia-ml-py is a dependency; a broken install says so
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({e}): pip install nvidia-ml-py") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML: {e}") from None
    return pynvml


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def nvml_index(cuda_ordinal: int, env=None) -> int | str:
    """The NVML index (or UUID) of a CUDA ordinal under CUDA_VISIBLE_DEVICES."""
    env = os.environ if env is None else env
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible or cuda_ordinal >= len(visible):
        return cuda_ordinal
    v = visible[cuda_ordinal]
    return int(v) if v.isdigit() else v


def handle(pynvml, index: int | str):
    if isinstance(index, str):
        return pynvml.nvmlDeviceGetHandleByUUID(index)
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def device_used_bytes(indices) -> list[int] | None:
    """Memory used on each device (all processes), from NVML; None without NVML."""
    try:
        pynvml = nvml()
    except NvmlUnavailable:
        return None
    try:
        return [int(pynvml.nvmlDeviceGetMemoryInfo(handle(pynvml, i)).used) for i in indices]
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def process_used_bytes(indices, pid: int | None = None) -> list[int] | None:
    """Memory this process holds on each device (NVML's per-process accounting); None when NVML
    cannot say (no NVML, or a container whose PIDs NVML does not see)."""
    pid = os.getpid() if pid is None else pid
    try:
        pynvml = nvml()
    except NvmlUnavailable:
        return None
    try:
        out = []
        for i in indices:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(pynvml, i))
            mine = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
            if not mine:
                return None
            out.append(int(sum(mine)))
        return out
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _clock_reasons(pynvml):
    # NVML renamed "throttle reasons" to "clock event reasons" (same bits); older bindings have only the first
    return getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons


def _stats(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


class Monitor:
    """NVML sampling on a background thread; use as a context manager around the work to watch."""

    def __init__(self, indices, interval: float = 0.05):
        self.indices = list(indices)
        self.interval = interval
        self.samples: list[dict] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pynvml: Any = None  # the pynvml module (untyped), once NVML started
        self._handles: list = []
        self._t0 = 0.0

    def __enter__(self) -> Monitor:
        try:
            self._pynvml = nvml()
            self._handles = [handle(self._pynvml, i) for i in self.indices]
        except NvmlUnavailable as e:
            self.error = str(e)
            return self
        except Exception as e:  # noqa: BLE001 -- a handle NVML refuses: monitoring off, measurement goes on
            self.error = f"NVML: {e}"
            return self
        self._t0 = time.perf_counter()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="jaxmem-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.sample()
        if self._pynvml is not None:
            try:
                self._pynvml.nvmlShutdown()
            except self._pynvml.NVMLError:
                pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        p = self._pynvml
        t = round(time.perf_counter() - self._t0, 4)
        for index, h in zip(self.indices, self._handles, strict=True):
            s = {"t": t, "gpu": index}
            # each read on its own: a card without power readings still reports the rest
            for key, read in (("utilization_pct", lambda h: p.nvmlDeviceGetUtilizationRates(h).gpu),
                              ("memory_used_bytes", lambda h: p.nvmlDeviceGetMemoryInfo(h).used),
                              ("power_w", lambda h: p.nvmlDeviceGetPowerUsage(h) / 1000.0),
                              ("temperature_c", lambda h: p.nvmlDeviceGetTemperature(h, p.NVML_TEMPERATURE_GPU)),
                              ("clock_event_reasons", lambda h: _clock_reasons(p)(h))):
                try:
                    s[key] = read(h)
                except p.NVMLError:
                    s[key] = None
            self.samples.append(s)

    def summary(self) -> dict:
        """min / median / max per metric over every sample of every watched GPU; throttle reasons seen."""
        if self.error is not None:
            return {"available": False, "error": self.error, "samples": 0}
        metrics = {m: _stats([s[m] for s in self.samples if s.get(m) is not None]) for m in METRICS}
        reasons: dict[str, int] = {}
        for s in self.samples:
            bits = s.get("clock_event_reasons") or 0
            for bit, name in THROTTLE_REASONS.items():
                if bits & bit:
                    reasons[name] = reasons.get(name, 0) + 1
        n = len(self.samples)
        window = max((s["t"] for s in self.samples), default=0.0)
        return {
            "available": True,
            "gpus": self.indices,
            "interval_s": self.interval,
            "samples": n,
            "window_s": window,
            "metrics": metrics,
            "throttled": bool(reasons),
            "throttle_reasons": reasons,      # reason -> samples in which it was active
        }

    def trace(self) -> list[dict]:
        """Every sample (for the HTML trace)."""
        return [dict(s) for s in self.samples]


def throttle_warning(summary: dict) -> str | None:
    """A warning line when the card throttled while watched."""
    if not summary.get("throttled"):
        return None
    reasons = ", ".join(f"{k} ({v} of {summary['samples']} samples)" for k, v in summary["throttle_reasons"].items())
    return (f"the GPU slowed its clocks while the step ran: {reasons}; timings from this run are not representative "
            "(check cooling, power limits: nvidia-smi -q -d PERFORMANCE)")


def monitor_lines(summary: dict | None) -> list[str]:
    """The terminal lines for a monitor summary (verify on a GPU)."""
    if not summary:
        return []
    if not summary.get("available"):
        return [f"GPU monitoring: unavailable ({summary.get('error', 'NVML')})"]
    m = summary["metrics"]

    def trio(key, fmt):
        s = m.get(key)
        return "n/a" if s is None else " / ".join(fmt(s[k]) for k in ("min", "median", "max"))

    steps = summary.get("steps")
    return [
        f"GPU while the step ran (NVML, {summary['samples']} samples over {summary['window_s']:.2f} s"
        + (f", {steps} steps" if steps else "") + ", min / median / max):",
        (f"  utilization {trio('utilization_pct', lambda v: f'{v:.0f}%')}; "
         f"memory used {trio('memory_used_bytes', lambda v: f'{v / 2**30:.2f} GiB')}"),
        f"  power {trio('power_w', lambda v: f'{v:.0f} W')}; "
        f"temperature {trio('temperature_c', lambda v: f'{v:.0f} C')}"
        + ("; throttled: " + ", ".join(summary["throttle_reasons"]) if summary.get("throttled") else "; no throttling"),
    ]
