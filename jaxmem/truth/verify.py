"""Predicted vs measured: `jaxmem verify` and `jaxmem calibrate`.

``verify`` predicts the step exactly as ``jaxmem analyze`` does for the local
backend (``--gpu cpu`` or ``--gpu local``; the number compared is analyze's own
``per_device_peak_bytes``, runtime overhead included), then measures the same step
on this machine in a fresh process (:mod:`jaxmem.truth.measure`) and compares, per device.

``calibrate`` measures the runtime overhead that analyze adds to XLA's numbers --
the memory a real run uses outside XLA's buffer assignment -- and stores it per
device kind, with where and when it was measured (:func:`jaxmem.compiler.calibration.save`).
On a GPU the measured step is watched through NVML (:mod:`jaxmem.truth.monitor`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
from typing import Any

import flax
import jax
import jaxlib

from jaxmem.compiler import calibration, targets
from jaxmem.errors import UserError
from jaxmem.pipeline import analyze_file
from jaxmem.program.workload import StepChoice
from jaxmem.truth import measure
from jaxmem.truth.monitor import throttle_warning
from jaxmem.units import fmt_bytes

# Host memory a CPU measurement needs besides the step itself: the Python process,
# jax and the compiled program (about 0.5 GB measured here), with room to spare.
CPU_PROCESS_ALLOWANCE = 1 << 30
CPU_MEMORY_MARGIN = 0.9   # use at most this share of MemAvailable


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    report: Any                        # the prediction: analyze's Report for the local backend
    case: measure.Case
    measurement: dict                  # the measuring process's result
    per_device: tuple[dict, ...]

    @property
    def predicted_peak_bytes(self) -> int:
        return self.report.per_device_peak_bytes

    @property
    def measured_peak_bytes(self) -> int:
        return max(d["measured_peak_bytes"] for d in self.per_device)

    @property
    def relative_error(self) -> float:
        return relative_error(self.predicted_peak_bytes, self.measured_peak_bytes)

    @property
    def method(self) -> dict:
        m = self.measurement
        out = {
            "description": m["method"],
            "backend": m["backend"],
            "device": m["device"],
            "devices": m["n_devices"],
            "fresh_process": True,
            "runtime_overhead": {"bytes_per_device": self.report.breakdown.get("runtime_overhead", 0),
                                 "source": self.report.runtime_overhead_source},
            "runtime": self.report.runtime,
            "wall_s": m.get("wall_s"),
        }
        if m["backend"] == "cpu":
            out.update({
                "baseline_bytes": m["rss_before_step"],
                "step_extra_bytes": m["step_extra_bytes"],
                "arguments_rss_delta_bytes": m["rss_args_delta"],
                "arguments_bytes": sum(m["args_bytes"]),
                "split": "the step's extra RSS is one number for the whole process; it is split equally over "
                         "the devices (symmetric layouts)",
                "allocator": "glibc with MALLOC_MMAP_THRESHOLD_=65536: freed blocks leave the RSS at once",
            })
        else:
            out.update({"bytes_limit": m.get("bytes_limit"), "out_of_pool_bytes": m.get("out_of_pool_bytes"),
                        "out_of_pool_method": m.get("out_of_pool_method")})
        return out

    @property
    def monitor(self) -> dict | None:
        """NVML's view of the card while the step ran (GPU only): min / median / max per metric."""
        return self.measurement.get("monitor")

    @property
    def warnings(self) -> list[str]:
        w = throttle_warning(self.monitor or {})
        return [w] if w else []

    def to_json(self) -> dict:
        r = self.report
        return {
            "schema": "jaxmem.truth.verify/1",
            "model": r.model,
            "source": r.source,
            "target": r.target.gpu,
            "mesh": dict(r.mesh),
            "layout": r.layout,
            "options": r.options,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "measured_peak_bytes": self.measured_peak_bytes,
            "relative_error": self.relative_error,
            "per_device": list(self.per_device),
            "method": self.method,
            "prediction": {"breakdown": r.breakdown, "xla": r.xla},
            "monitor": self.monitor,
            "warnings": self.warnings,
            "versions": r.versions,
        }


def relative_error(predicted: int, measured: int) -> float:
    """Signed: (predicted - measured) / measured; negative means jaxmem predicted too little."""
    return (predicted - measured) / measured if measured else float("nan")


def local_backend(gpu: str | None) -> str:
    """'cpu' or 'gpu': where verify can run the step. None means the attached GPU, else the CPU."""

    key = (gpu or "").strip().lower()
    if key == "cpu":
        return "cpu"
    n_gpus = targets.local_gpu_count()
    if not key:
        return "gpu" if n_gpus else "cpu"
    if n_gpus == 0:
        raise UserError(f"verify and calibrate measure on this machine, which has no GPU: use --gpu cpu (or no "
                        f"--gpu), not --gpu {gpu}")
    return "gpu"


def catalogue_key(device_kind: str) -> str | None:
    """The catalogue GPU a local device is (its CUDA name, exactly or as a prefix), if any."""

    kind = device_kind.strip().lower()
    for spec in targets.CATALOGUE.values():
        desc = spec.description.lower()
        if kind == desc or desc.startswith(kind) or kind.startswith(desc):
            return spec.key
    return None


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is no /proc)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_capacity(report, backend: str) -> None:
    """Refuse (UserError) when the local backend cannot hold the case; say how much it needs."""

    per_device = report.per_device_peak_bytes
    n = report.target.devices
    if backend == "cpu":
        avail = mem_available()
        if avail is None:
            return
        need = per_device * n + CPU_PROCESS_ALLOWANCE
        if need > avail * CPU_MEMORY_MARGIN:
            raise UserError(
                f"this machine cannot hold the case: it needs about {fmt_bytes(need)} of host memory "
                f"({n} device(s) x {fmt_bytes(per_device)} predicted + {fmt_bytes(CPU_PROCESS_ALLOWANCE)} for the "
                f"process) but {fmt_bytes(avail)} is available (MemAvailable); try a smaller --batch or preset")
        return
    limit = report.target.memory_bytes
    if limit and per_device > limit:
        raise UserError(f"the local GPU cannot hold the case: it needs about {fmt_bytes(per_device)} per device, "
                        f"the allocator's limit is {fmt_bytes(limit)}")


def case_for(path: str, opts, backend: str) -> measure.Case:
    choice = {f.name: getattr(opts, f.name) for f in dataclasses.fields(StepChoice)}
    return measure.Case(model_file=str(path), backend=backend, **choice)


def predict(path: str, opts):
    """analyze's Report for the local backend (what verify compares)."""

    backend = local_backend(opts.gpu)
    gpu = opts.gpu if opts.gpu else ("local" if backend == "gpu" else "cpu")
    if backend == "gpu" and gpu.lower() not in ("local", "cpu"):
        # a catalogue GPU, compiled for devicelessly: only comparable on that very GPU

        kind = jax.devices("gpu")[0].device_kind
        if catalogue_key(kind) != targets.resolve_gpu_name(gpu):
            raise UserError(f"--gpu {gpu}: this machine's GPU is {kind!r}; verify compares a prediction with a "
                            f"run on this machine, so use --gpu local (or the catalogue name of this GPU)")
    return backend, analyze_file(path, dataclasses.replace(opts, gpu=gpu, explain=False))


def combine(report, case: measure.Case, m: dict) -> VerifyResult:
    predicted = report.per_device_peak_bytes
    per_device = tuple(
        {"device": i, "predicted_peak_bytes": predicted, "measured_peak_bytes": int(meas),
         "relative_error": relative_error(predicted, int(meas))}
        for i, meas in enumerate(m["measured_peak_bytes"]))
    return VerifyResult(report, case, m, per_device)


def verify_file(path: str, opts, timeout: float = 600.0) -> VerifyResult:
    backend, report = predict(path, opts)
    check_capacity(report, backend)
    case = case_for(path, opts, backend)
    try:
        m = measure.run_case(case, timeout=timeout)
    except measure.MeasureError as e:
        raise UserError(f"measuring the step failed: {e}") from None
    return combine(report, case, m)


# ---------------------------------------------------------------- calibration

# The trivial step calibration runs, at two sizes, on 1 and on 8 host devices (CPU).
CPU_CALIBRATION_DEVICES = (1, 8)
CALIBRATION_SIZES = ({"width": 256, "batch": 64}, {"width": 2048, "batch": 1024})


@dataclasses.dataclass(frozen=True)
class Calibration:
    overhead: calibration.Entry     # what is stored for this device kind
    kind: str                       # the calibration key: "cpu" or the GPU's name
    runs: tuple[dict, ...]          # one per measured case: devices, size, measured, XLA's bound, excess
    path: str = ""

    def to_json(self) -> dict:
        return {"kind": self.kind, "overhead": dataclasses.asdict(self.overhead), "runs": list(self.runs),
                "path": self.path}


def _versions() -> str:
    return f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _excess(m: dict) -> int:
    """Measured bytes beyond XLA's lower bound, summed over the devices of the run."""
    return sum(m["measured_peak_bytes"]) - m["n_devices"] * m["xla"]["lower_bound"]


def _run_calibration_case(case: measure.Case) -> dict:
    try:
        return measure.run_case(case)
    except measure.MeasureError as e:
        raise UserError(f"calibration: measuring the trivial step failed: {e}") from None


def _calibration_case(size: dict, n: int, backend: str) -> measure.Case:
    return measure.Case(model_file=measure.BUILTIN_PREFIX + "calibration", model_args=tuple(size.items()),
                        mesh=f"data={n}", layout="dp", backend=backend)


def _calibrate_cpu(devices, sizes, repeats, today) -> tuple[calibration.Entry, list[dict]]:
    """CPU: the trivial step at each size on each device count; excess = measured - XLA's lower
    bound, summed over the devices; fitted as n_devices x per_device + per_process."""
    runs = []
    for n in devices:
        for size in sizes:
            for _ in range(repeats):
                m = _run_calibration_case(_calibration_case(size, n, "cpu"))
                runs.append({"devices": n, **size, "measured_bytes": sum(m["measured_peak_bytes"]),
                             "xla_lower_bound_bytes": n * m["xla"]["lower_bound"], "excess_bytes": _excess(m)})
    by_n = {n: statistics.median(r["excess_bytes"] for r in runs if r["devices"] == n) for n in devices}
    ns = sorted(by_n)
    if len(ns) >= 2:
        slope = (by_n[ns[-1]] - by_n[ns[0]]) / (ns[-1] - ns[0])
        per_device = max(int(slope), 0)
        per_process = max(int(statistics.median(by_n[n] - per_device * n for n in ns)), 0)
    else:
        per_device, per_process = 0, max(int(by_n[ns[0]]), 0)
    source = (f"measured by `jaxmem calibrate --gpu cpu` on {cpu_model()} ({os.cpu_count()} cores), {_versions()}: "
              f"peak RSS of a trivial training step (2 sizes, on {', '.join(map(str, ns))} host devices) minus "
              f"XLA's lower bound = {per_process} B per process + {per_device} B per device")
    return calibration.Entry(per_device, 0, source, today, per_process), runs


def _calibrate_gpu(sizes, repeats, today) -> tuple[calibration.Entry, list[dict], str]:
    """GPU: the runtime model's terms, measured (docs/how-it-works.md §7).

    * allocator (in the pool): peak_bytes_in_use of the trivial step on one GPU minus XLA's
      lower bound (median over sizes and repeats);
    * cuda_context (outside): the process's memory on that GPU (NVML) minus the pool;
    * one NCCL communicator (outside), with 2+ GPUs: the same step data-parallel over all of
      them (one all-reduce group: one communicator) -- its out-of-pool memory minus the context.
    """

    n_gpus = targets.local_gpu_count()
    runs, in_pool, context = [], [], []
    kind = ""
    for size in sizes:
        for _ in range(repeats):
            m = _run_calibration_case(_calibration_case(size, 1, "gpu"))
            kind = m["device"]
            excess = max(max(m["measured_peak_bytes"]) - m["xla"]["lower_bound"], 0)
            oop = (m.get("out_of_pool_bytes") or [None])[0]
            in_pool.append(excess)
            if oop is not None:
                context.append(oop)
            runs.append({"devices": 1, **size, "measured_bytes": max(m["measured_peak_bytes"]),
                         "xla_lower_bound_bytes": m["xla"]["lower_bound"], "excess_bytes": excess,
                         "out_of_pool_bytes": oop, "out_of_pool_method": m.get("out_of_pool_method")})
    if not context:
        raise UserError("calibration: NVML could not report this process's GPU memory (nvidia-ml-py and the "
                        "driver's libnvidia-ml are needed; `jaxmem doctor` checks them), so the memory outside JAX's "
                        "pool cannot be measured")
    ctx = int(statistics.median(context))
    nccl = None
    how_nccl = "one GPU only: NCCL's communicator size stays the estimate"
    if n_gpus >= 2:
        m = _run_calibration_case(_calibration_case(sizes[0], n_gpus, "gpu"))
        oop = m.get("out_of_pool_bytes")
        if oop:
            nccl = max(max(oop) - ctx, 0)
            how_nccl = f"one communicator = out-of-pool memory of a data-parallel step on {n_gpus} GPUs - the context"
            runs.append({"devices": n_gpus, **sizes[0], "measured_bytes": max(m["measured_peak_bytes"]),
                         "xla_lower_bound_bytes": m["xla"]["lower_bound"],
                         "excess_bytes": max(max(m["measured_peak_bytes"]) - m["xla"]["lower_bound"], 0),
                         "out_of_pool_bytes": max(oop), "out_of_pool_method": m.get("out_of_pool_method")})
    source = (f"measured by `jaxmem calibrate --gpu local` on {kind}, {_versions()}: allocator = peak_bytes_in_use "
              f"of a trivial step minus XLA's lower bound; cuda_context = the process's GPU memory (NVML) minus the "
              f"pool; {how_nccl}")
    return calibration.Entry(int(statistics.median(in_pool)), ctx, source, today, 0, nccl), runs, kind


def calibrate(gpu: str | None = None, devices: tuple[int, ...] | None = None, sizes: tuple[dict, ...] | None = None,
              repeats: int = 1, save: bool = True) -> Calibration:
    """Measure the runtime's own memory on this machine's backend and store it (calibration.save)."""
    devices = CPU_CALIBRATION_DEVICES if devices is None else devices
    sizes = CALIBRATION_SIZES if sizes is None else sizes
    backend = local_backend(gpu)
    today = datetime.date.today().isoformat()
    if save:
        calibration.read_user()  # a bad file is refused before minutes of measuring, and never overwritten
    if backend == "cpu":
        entry, runs = _calibrate_cpu(devices, sizes, repeats, today)
        kind = "cpu"
    else:
        entry, runs, kind = _calibrate_gpu(sizes, repeats, today)
    path = ""
    if save:
        kinds = [kind]
        key = catalogue_key(kind) if kind != "cpu" else None
        if key and targets.CATALOGUE[key].description != kind:  # analyze --gpu <catalogue name> looks it up so
            kinds.append(targets.CATALOGUE[key].description)
        path = str(calibration.save(kinds, entry))
    return Calibration(entry, kind, tuple(runs), path)

