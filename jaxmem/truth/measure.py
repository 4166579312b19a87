"""Ground truth: run one training step on this machine and measure its real peak.

Every measurement runs in a fresh process (``python -m jaxmem.truth.measure``, the case as
JSON on stdin, the result as one JSON line on stdout), because

* the OS peak (CPU) and the allocator peak (GPU) cannot be trusted after other work
  in the same process: compile garbage, freed-but-kept heap, a GPU peak that cannot
  be reset;
* the number of forced host devices (a CPU mesh) must be set before jax starts.

How the peak is measured
------------------------

CPU (every machine): the step is compiled for the local CPU devices, its arguments
are filled with random data on the devices, then ``5`` is written to
``/proc/self/clear_refs`` (the kernel resets the process's peak RSS, ``VmHWM``, to
the current RSS), the step runs once, and ``VmHWM - VmRSS(before)`` is the memory
the step added: XLA's temporaries, outputs that did not reuse a donated input, and
the runtime's own allocations. The arguments were already resident before the
reset; their bytes are those of the live argument buffers on each device. All
forced host devices share one process, so the added memory is one number for all
of them: it is split equally over the devices (the layouts jaxmem builds are
symmetric: every device runs the same program on equal shards).

    measured(device d) = argument bytes on d + (VmHWM - VmRSS) / n_devices

The measuring process runs with ``MALLOC_MMAP_THRESHOLD_=65536``: glibc serves
every block of 64 KiB or more with its own mmap, so a freed buffer leaves the RSS
at once and the RSS follows the live buffers, not the allocator's history (without
it, memory freed while the arguments were made is reused by the step unseen, or
kept after it: up to 15% off on a data-parallel case here). The step is compiled
by :func:`jaxmem.compiler.compiled.lower_and_compile`, exactly as ``jaxmem analyze`` does.

GPU: ``device.memory_stats()["peak_bytes_in_use"]`` per device, the allocator's
peak since the process started (arguments included), with
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` so that the pool grows only as used.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import subprocess
import sys
import time
import traceback

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmem.compiler import compiled as compiled_mod
from jaxmem.errors import UserError
from jaxmem.program import layouts, step
from jaxmem.program.workload import StepChoice, Workload, load_workload
from jaxmem.truth import monitor

BUILTIN_PREFIX = "builtin:"
MALLOC_MMAP_THRESHOLD = 65536


@dataclasses.dataclass(frozen=True)
class Case(StepChoice):
    """One training step to measure: the step analyze predicts (StepChoice), as plain data."""

    model_file: str = ""                  # a model file, or "builtin:calibration"
    backend: str = "cpu"                  # "cpu" or "gpu": where the step runs
    # True: compile with XLA's default options (on CPU: YNNPACK fusions on) instead of the options
    # jaxmem compiles with -- the program a user's own jax.jit runs (benchmarks/accuracy.py measures both)
    xla_defaults: bool = False

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["model_args"] = [list(kv) for kv in self.model_args]
        return d

    @classmethod
    def from_json(cls, d: dict) -> Case:
        d = dict(d)
        d["model_args"] = tuple(tuple(kv) for kv in d.get("model_args", ()))
        return cls(**d)

    @property
    def n_devices(self) -> int:
        return layouts.mesh_size(self.mesh)


class MeasureError(RuntimeError):
    """The measuring process failed (not a user error: the step itself broke)."""


# ---------------------------------------------------------------- parent side


def child_env(case: Case) -> dict[str, str]:
    """The environment of a measuring process: set before its jax starts."""
    env = dict(os.environ)
    env.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    if case.backend == "cpu":
        # Exactly the mesh's devices; no GPU runtime in the process (its context would be in the RSS).
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
        flags.append(f"--xla_force_host_platform_device_count={case.n_devices}")
        env["XLA_FLAGS"] = " ".join(flags)
        env["JAX_PLATFORMS"] = "cpu"
        # glibc keeps freed heap memory for reuse, so RSS would follow the allocator's history, not the live
        # buffers (up to +15% measured on a dp all-reduce case). Serve every block >= 64 KiB with mmap
        # (freed blocks leave the RSS at once) and trim the heap eagerly.
        env["MALLOC_MMAP_THRESHOLD_"] = str(MALLOC_MMAP_THRESHOLD)
        env["MALLOC_TRIM_THRESHOLD_"] = str(2 * MALLOC_MMAP_THRESHOLD)
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the pool grows only as used
        env.pop("JAX_PLATFORMS", None)
    return env


def run_case(case: Case, timeout: float = 600.0) -> dict:
    """Measure `case` in a fresh process; returns the child's result dict."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "jaxmem.truth.measure"], input=json.dumps(case.to_json()),
                              capture_output=True, text=True, env=child_env(case), timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise MeasureError(f"the measuring process ran past --timeout {timeout:g} s; give it more time "
                           f"(e.g. --timeout {max(600, 10 * timeout):g})") from None
    result = None
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                result = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if result is None:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-15:])
        hint = " (killed: out of memory?)" if proc.returncode in (-9, 137) else ""
        raise MeasureError(f"the measuring process exited with {proc.returncode}{hint} and no result:\n{tail}")
    if "user_error" in result:
        raise UserError(result["user_error"])
    if "error" in result:
        raise MeasureError(result["error"])
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    return result


# ---------------------------------------------------------------- child side


def proc_status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak RSS (VmHWM) to the current RSS (proc(5))
    except OSError as e:
        raise UserError(f"the CPU measurement resets the peak RSS through /proc/self/clear_refs, which failed here "
                        f"({e}); it needs Linux >= 4.0") from None


def calibration_workload(width: int = 256, batch: int = 64):
    """A trivial training step (a 2-layer MLP): what calibration runs to see the runtime's own cost."""


    class Tiny(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(8)(nn.relu(nn.Dense(width)(x)))

    def loss(model, b):
        return optax.softmax_cross_entropy_with_integer_labels(model(b["x"]), b["y"]).mean()

    b = {"x": jax.ShapeDtypeStruct((batch, width), jnp.float32), "y": jax.ShapeDtypeStruct((batch,), jnp.int32)}
    return Workload(model=Tiny(), batch=b, loss=loss, optimizer=optax.adamw(1e-3), name="calibration")


def load_case_workload(case: Case):
    if case.model_file.startswith(BUILTIN_PREFIX):
        name = case.model_file[len(BUILTIN_PREFIX):]
        if name != "calibration":
            raise UserError(f"unknown builtin workload {name!r}")
        return calibration_workload(**dict(case.model_args))
    return load_workload(case.model_file, remat=case.remat, **dict(case.model_args))


def build_case(case: Case, devices):
    """The same step `analyze` builds, on `devices` (local ones)."""

    wl = load_case_workload(case)
    mesh_spec = layouts.parse_mesh(case.mesh, case.axis_roles)
    planned = step.plan(wl, case.step_options(), mesh_spec)
    return step.build(planned, layouts.build_mesh(devices, mesh_spec, planned.axis_types))


def random_args(built, seed: int = 0):
    """Real arrays for every abstract argument, placed on the devices with their shardings.

    Floats: normal * 0.02 (optimizer state: its absolute value, so that Adam's
    second moment stays valid); integers: 0 or 1 (valid token ids and labels for
    any vocabulary); unsigned (RNG key data): random bits. Each shard is cut from a
    1 Mi-element pool of random numbers at a random offset: no device compiles
    anything to make its data, and no host array is larger than one shard.
    """

    leaves, treedef = jax.tree.flatten(built.args)
    cats = [leaf.category for leaf in built.leaves] if len(built.leaves) == len(leaves) else [""] * len(leaves)
    rng = np.random.default_rng(seed)
    normal = (rng.standard_normal(1 << 20, dtype=np.float32) * 0.02).astype(np.float32)
    pools = {"normal": normal, "abs": np.abs(normal), "int": rng.integers(0, 2, 1 << 20, dtype=np.int64),
             "bits": rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64)}

    def pool_for(dt, cat):
        if jnp.issubdtype(dt, jnp.floating):
            return pools["abs" if cat == "optimizer_state" else "normal"].astype(dt)
        if jnp.issubdtype(dt, jnp.unsignedinteger):
            return pools["bits"].astype(dt)
        if jnp.issubdtype(dt, jnp.integer):
            return pools["int"].astype(dt)
        return np.zeros(1 << 20, dt)

    arrays = []
    for i, (sds, cat) in enumerate(zip(leaves, cats, strict=True)):
        if jax.dtypes.issubdtype(sds.dtype, jax.dtypes.prng_key):  # typed keys (NNX rng streams)
            key = jax.random.key(seed + i, impl=getattr(sds.dtype, "_impl", None))
            keys = jax.random.split(key, max(math.prod(sds.shape), 1)).reshape(sds.shape)
            arrays.append(jax.device_put(keys, sds.sharding))
            continue
        pool = pool_for(jnp.dtype(sds.dtype), cat)
        offset = int(rng.integers(0, pool.size))

        def shard(index, shape=sds.shape, pool=pool, offset=offset):
            shard_shape = tuple(len(range(*s.indices(d))) for s, d in zip(index, shape, strict=True))
            return np.resize(np.roll(pool, offset), shard_shape)

        arrays.append(jax.make_array_from_callback(sds.shape, sds.sharding, shard))
    jax.block_until_ready(arrays)
    return jax.tree.unflatten(treedef, arrays), arrays


def per_device_bytes(arrays, devices) -> list[int]:
    index = {d.id: i for i, d in enumerate(devices)}
    out = [0] * len(devices)
    for a in arrays:
        for shard in a.addressable_shards:
            if shard.device.id in index:
                out[index[shard.device.id]] += int(shard.data.nbytes)
    return out


def _compile(built, xla_defaults: bool = False):
    """The same lower + compile as `jaxmem analyze` (jaxmem.compiler.compiled), so the measured program is the
    predicted one; with `xla_defaults`, the same step compiled with XLA's default options instead (what a
    user's plain jax.jit gets: on CPU, YNNPACK fusions on)."""

    if xla_defaults:
        lowered, _ = compiled_mod.lower(built)
        compiled = lowered.compile()
        return compiled, xla_numbers(compiled)
    compiled, st = compiled_mod.lower_and_compile(built)
    xla = {"argument": st.argument, "output": st.output, "alias": st.alias, "temp": st.temp,
           "generated_code": st.generated_code, "lower_bound": st.lower_bound}
    return compiled, xla


def xla_numbers(compiled) -> dict[str, int]:
    """XLA's per-device memory numbers of a compiled program, as `_compile` reports them."""
    m = compiled.memory_analysis()
    xla = {"argument": int(m.argument_size_in_bytes), "output": int(m.output_size_in_bytes),
           "alias": int(m.alias_size_in_bytes), "temp": int(m.temp_size_in_bytes),
           "generated_code": int(m.generated_code_size_in_bytes)}
    xla["lower_bound"] = xla["generated_code"] + xla["argument"] + xla["output"] - xla["alias"] + xla["temp"]
    return xla


CPU_METHOD = ("peak RSS: /proc/self/clear_refs reset after the arguments were placed; per device = argument bytes on "
              "the device + (VmHWM - VmRSS) / n_devices (one process holds all host devices)")


def compile_note(xla_defaults: bool) -> str:
    """Which CPU program was measured: the one `jaxmem analyze --gpu cpu` predicts, or a plain jax.jit's."""
    if xla_defaults:
        return "compiled with XLA's default options (YNNPACK fusions on): the program a plain jax.jit runs"
    return ("compiled as `jaxmem analyze --gpu cpu` compiles it, with XLA:CPU's YNNPACK fusions off "
            "(xla_cpu_experimental_ynn_fusion_type='')")


def peak_of_one_cpu_run(compiled, args, arrays, devices) -> dict:
    """Run `compiled(*args)` once and measure its peak as described in the module doc.

    `arrays` are the argument arrays already placed on `devices` (their shards are the
    argument bytes per device). Shared by jaxmem's own measurement and the hand-written
    steps of benchmarks/handwritten, so both are measured by the same code.
    """

    n = len(devices)
    args_per_device = per_device_bytes(arrays, devices)
    del arrays
    gc.collect()
    reset_peak_rss()
    base = proc_status()["VmRSS"]
    t_run = time.perf_counter()
    out = compiled(*args)
    jax.block_until_ready(out)
    t_done = time.perf_counter()
    status = proc_status()
    step_extra = max(status["VmHWM"] - base, 0)
    return {
        "backend": "cpu",
        "device": devices[0].device_kind,
        "n_devices": n,
        "measured_peak_bytes": [a + step_extra // n for a in args_per_device],
        "args_bytes": args_per_device,
        "step_extra_bytes": step_extra,
        "rss_before_step": base,
        "rss_after_step": status["VmRSS"],
        "step_s": round(t_done - t_run, 2),
        "method": CPU_METHOD,
    }


def measure_cpu(case: Case) -> dict:
    t0 = time.perf_counter()
    built = build_case(case, jax.devices("cpu"))
    devices = list(built.mesh.devices.flat)
    compiled, xla = _compile(built, case.xla_defaults)
    t_compiled = time.perf_counter()
    rss_before_args = proc_status()["VmRSS"]
    args, arrays = random_args(built)
    gc.collect()
    rss_args = proc_status()["VmRSS"]
    result = peak_of_one_cpu_run(compiled, args, arrays, devices)
    del arrays
    result.update({
        "method": result["method"] + "; " + compile_note(case.xla_defaults),
        "rss_args_delta": rss_args - rss_before_args,
        "xla": xla,
        "xla_defaults": case.xla_defaults,
        "timings": {"build_compile_s": round(t_compiled - t0, 2), "step_s": result.pop("step_s")},
    })
    return result


MONITOR_SECONDS = 1.0   # how long the card is watched at least: one step is often a few ms


def _more_steps_for_the_monitor(compiled, args, out, seconds: float | None = None, max_steps: int = 1000) -> int:
    """Run jaxmem's train step again on its own outputs for MONITOR_SECONDS, so NVML sees the card
    training rather than one short burst. Only for jaxmem's built step, whose outputs
    (trainable, opt_state, mutable, rng, loss) feed the next step's donated arguments
    (trainable, frozen, opt_state, mutable, rng, batch); a custom step runs once."""

    if not (isinstance(out, (tuple, list)) and len(out) == 5 and len(args) == 6):
        return 0
    seconds = MONITOR_SECONDS if seconds is None else seconds
    steps, t0 = 0, time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds and steps < max_steps:
            out = compiled(out[0], args[1], out[1], out[2], out[3], args[5])
            jax.block_until_ready(out)
            steps += 1
    except Exception:  # noqa: BLE001 -- the measurement is already taken; the monitor just stops
        pass
    return steps


def measure_gpu(case: Case) -> dict:
    """The allocator's peak per device, with the card watched through NVML while the step runs.

    Also what the process holds outside JAX's pool: NVML's per-process memory minus the
    pool (the CUDA context, library handles, NCCL's buffers) -- or, where NVML cannot see
    this process (some containers), the device's memory used after minus before, less the pool.
    """
    # NOTE: not yet run on a GPU here (no GPU was available to this project); the NVML side is
    # tested against a fake of the NVML calls (tests/test_monitor.py).

    nvml_ids = [monitor.nvml_index(i) for i in range(case.n_devices)]  # the mesh takes the first n GPUs
    used_before = monitor.device_used_bytes(nvml_ids)  # before jax starts: other processes' memory

    t0 = time.perf_counter()
    devices = jax.devices("gpu")
    built = build_case(case, devices)
    devices = list(built.mesh.devices.flat)
    nvml_ids = [monitor.nvml_index(d.local_hardware_id if d.local_hardware_id is not None else d.id) for d in devices]
    compiled, xla = _compile(built)
    t_compiled = time.perf_counter()
    args, arrays = random_args(built)
    args_per_device = per_device_bytes(arrays, devices)
    del arrays
    with monitor.Monitor(nvml_ids) as watch:
        t_run = time.perf_counter()
        out = compiled(*args)
        jax.block_until_ready(out)
        t_done = time.perf_counter()
        stats = [d.memory_stats() or {} for d in devices]  # the measured step's peak, before any other step
        extra_steps = _more_steps_for_the_monitor(compiled, args, out)
    peaks = [int(s.get("peak_bytes_in_use", 0)) for s in stats]
    # the pool now (the monitor's extra steps may have grown it), against the process's memory now
    pools = [int(s.get("pool_bytes") or s.get("bytes_reserved") or s.get("peak_bytes_in_use", 0))
             for s in (d.memory_stats() or {} for d in devices)]
    process = monitor.process_used_bytes(nvml_ids)
    out_of_pool, how = None, None
    if process is not None:
        out_of_pool = [max(u - p, 0) for u, p in zip(process, pools, strict=True)]
        how = "NVML per-process memory minus the pool"
    else:
        used_after = monitor.device_used_bytes(nvml_ids)
        if used_before and used_after:
            out_of_pool = [max(a - b - p, 0) for a, b, p in zip(used_after, used_before, pools, strict=True)]
            how = "NVML device memory used after minus before, minus the pool"
    return {
        "backend": "gpu",
        "device": devices[0].device_kind,
        "n_devices": len(devices),
        "measured_peak_bytes": peaks,
        "args_bytes": args_per_device,
        "bytes_limit": [int(s.get("bytes_limit", 0)) for s in stats],
        "pool_bytes": pools,
        "process_used_bytes": process,
        "out_of_pool_bytes": out_of_pool,
        "out_of_pool_method": how,
        "monitor": {**watch.summary(), "steps": 1 + extra_steps},
        "monitor_trace": watch.trace(),
        "xla": xla,
        "timings": {"build_compile_s": round(t_compiled - t0, 2), "step_s": round(t_done - t_run, 2)},
        "method": ("allocator peak: device.memory_stats()['peak_bytes_in_use'] per device in a fresh process, "
                   "XLA_PYTHON_CLIENT_PREALLOCATE=false"),
    }


def _child_main() -> int:
    try:
        case = Case.from_json(json.loads(sys.stdin.read()))
        result = measure_cpu(case) if case.backend == "cpu" else measure_gpu(case)
    except UserError as e:
        result = {"user_error": str(e)}
    except Exception as e:  # noqa: BLE001 -- reported to the parent, which raises MeasureError

        result = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
