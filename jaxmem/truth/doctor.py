"""`jaxmem doctor`: is this machine's GPU stack sound for JAX, and what do its memory settings mean?

Each check passes, warns or fails, and a failure says how to fix it:

* ``gpus``: the NVIDIA driver and GPUs, through NVML (nvidia-ml-py): name, driver,
  memory, compute capability; ``nvidia-smi``'s view when it is installed. No GPU and no
  driver is a warning (``analyze`` compiles devicelessly), or a failure under
  ``--require-gpu``; a driver that is installed but cannot be reached is a failure.
* ``versions``: jax, jaxlib and the CUDA plugin against each other, and the CUDA
  components (runtime, cuDNN, cuBLAS, cuFFT, cuSPARSE, cuPTI) as the CUDA plugin itself
  checks them (``jax_plugins.xla_cuda12._check_cuda_versions``), the driver's CUDA
  version, NCCL.
* ``smoke``: a tiny Flax model and batch on the GPU, one jitted forward and backward, in
  a fresh process with this environment: the parameters, batch and gradients must live
  on the GPU (the silent fall-back to the CPU fails here).
* ``memory_settings``: preallocation, memory fraction, allocator, the ``XLA_FLAGS`` and
  NCCL variables that change memory, and what they mean for what nvidia-smi shows.
* ``calibration``: the calibration file analyze reads is valid, and covers the GPUs here
  (else their runtime terms are estimates).
* ``deviceless``: one tiny deviceless compile per catalogue GPU -- what ``analyze``
  does on any machine, GPU or not.

Exit code (the CLI): 0 when no check fails (warnings allowed), 3 when one fails, 2 on a
user error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxmem.compiler import calibration, targets
from jaxmem.errors import UserError
from jaxmem.pipeline import AnalyzeOptions, analyze_workload
from jaxmem.truth.measure import calibration_workload

EXIT_CHECK_FAILED = 3
# Files the NVIDIA kernel driver creates: present means a driver is installed even if NVML cannot be loaded.
DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
SMOKE_TIMEOUT_S = 300
INSTALL = ("pip install 'jax[cuda12]==<your jax version>' (or jax[cuda13]; its wheels bring the CUDA libraries jaxlib "
           "was built with)")


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: str                     # pass | warn | fail | skip
    summary: str
    fix: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else EXIT_CHECK_FAILED

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> dict:
        return {"schema": "jaxmem.doctor/1", "ok": self.ok, "exit_code": self.exit_code,
                "checks": [dataclasses.asdict(c) for c in self.checks]}


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


# ---------------------------------------------------------------- gpus


def check_gpus(require_gpu: bool = False) -> Check:
    try:
        import pynvml  # noqa: PLC0415 - NVML loads only where a GPU is looked at
    except ImportError:
        return Check("gpus", "fail", "nvidia-ml-py (NVML's Python bindings) is not installed",
                     "pip install nvidia-ml-py (a jaxmem dependency: reinstall jaxmem)")
    smi = _nvidia_smi()
    driver_files = [p for p in DRIVER_PATHS if os.path.exists(p)]
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        if driver_files:
            return Check("gpus", "fail", f"an NVIDIA driver is installed ({', '.join(driver_files)}) but its NVML "
                         "library (libnvidia-ml.so.1) cannot be loaded, so neither can CUDA's",
                         "in a container, start it with the NVIDIA container toolkit (docker run --gpus all ...); "
                         "otherwise reinstall the driver, or add its library folder to LD_LIBRARY_PATH",
                         {"driver_files": driver_files, "nvidia_smi": smi})
        status = "fail" if require_gpu else "warn"
        return Check("gpus", status, "no NVIDIA GPU or driver on this machine: `jaxmem analyze` still works, by "
                     "deviceless compilation for every catalogue GPU (see the deviceless check); `verify` and "
                     "`calibrate` measure on the CPU",
                     "run on a machine with an NVIDIA GPU and its driver" if require_gpu else "",
                     {"gpu_count": 0, "nvidia_smi": smi})
    except pynvml.NVMLError as e:
        return Check("gpus", "fail", f"NVML cannot start: {e}",
                     "the driver is not loaded or does not match the kernel module: check `nvidia-smi`, reboot after a "
                     "driver update, or reinstall the driver",
                     {"driver_files": driver_files, "nvidia_smi": smi})
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        n = pynvml.nvmlDeviceGetCount()
        gpus: list[dict[str, Any]] = []
        for i in range(n):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append({"index": i, "name": _text(pynvml.nvmlDeviceGetName(h)), "memory_total_bytes": int(mem.total),
                         "memory_used_bytes": int(mem.used), "compute_capability": f"{major}.{minor}"})
    except pynvml.NVMLError as e:
        return Check("gpus", "fail", f"NVML started but cannot read the GPUs: {e}",
                     "check `nvidia-smi`; a GPU that fell off the bus needs a reset or reboot",
                     {"nvidia_smi": smi})
    finally:
        pynvml.nvmlShutdown()
    details = {"driver_version": driver, "gpu_count": n, "gpus": gpus, "nvidia_smi": smi}
    if n == 0:
        return Check("gpus", "fail" if require_gpu else "warn", f"NVIDIA driver {driver} but no GPU visible "
                     "(CUDA_VISIBLE_DEVICES, or a container started without --gpus?)",
                     "start the container with --gpus all, or check CUDA_VISIBLE_DEVICES", details)
    names = ", ".join(sorted({g["name"] for g in gpus}))
    return Check("gpus", "pass", f"{n} GPU(s) ({names}), driver {driver}", "", details)


def _nvidia_smi() -> dict | None:
    """nvidia-smi's own view (name, driver, memory), when the tool is installed."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total,memory.used",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"path": exe, "error": str(e)}
    if out.returncode != 0:
        return {"path": exe, "error": (out.stderr or out.stdout).strip()[:300]}
    return {"path": exe, "gpus": [line.strip() for line in out.stdout.splitlines() if line.strip()]}


# ---------------------------------------------------------------- versions


def _dist(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_plugin():
    """The jax CUDA plugin module and its `cuda_versions` extension (None, None when not installed)."""
    for name in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        try:
            plugin = importlib.import_module(name)
        except ImportError:
            continue
        plugin._load_nvidia_libraries()
        plugin._import_extensions()
        return plugin, plugin.cuda_versions
    return None, None


# How each library encodes its version as one integer (their headers' *_VERSION macros).
_ENCODING = {"cuda_runtime": (1000, 10), "driver": (1000, 10), "cudnn": (10000, 100), "cublas": (10000, 100),
             "cufft": (1000, 100), "cusparse": (1000, 100)}


def _fmt_version(v: int | None, kind: str = "cuda_runtime") -> str | None:
    """12090 -> 12.9 (CUDA runtime, driver), 92800 -> 9.28.0 (cuDNN), 120903 -> 12.9.3 (cuBLAS), 12510 -> 12.5.10."""
    if not v:
        return None
    major_div, minor_div = _ENCODING[kind]
    major, rest = divmod(v, major_div)
    minor, patch = divmod(rest, minor_div)
    return f"{major}.{minor}" if kind in ("cuda_runtime", "driver") else f"{major}.{minor}.{patch}"


def check_versions(gpu_present: bool) -> Check:
    versions = {"jax": _dist("jax"), "jaxlib": _dist("jaxlib")}
    plugin_dists = {d: _dist(d)
                    for d in ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt")}
    versions.update({k: v for k, v in plugin_dists.items() if v})
    mismatched: dict[str, str | None] = {k: v for k, v in versions.items()
                                         if v and v != versions["jaxlib"] and k != "jax"}
    if versions["jax"] != versions["jaxlib"]:
        mismatched["jax"] = versions["jax"]
    versions["nccl"] = _dist("nvidia-nccl-cu12") or _dist("nvidia-nccl-cu13")
    plugin, cv = cuda_plugin()
    details: dict[str, Any] = {"packages": versions}
    if mismatched:
        return Check("versions", "fail", f"jax {versions['jax']}, jaxlib {versions['jaxlib']} and the CUDA plugin "
                     f"differ: {', '.join(f'{k} {v}' for k, v in mismatched.items())}", INSTALL, details)
    if plugin is None or cv is None:
        return Check("versions", "fail" if gpu_present else "warn",
                     f"jax {versions['jax']} has no CUDA plugin installed: no GPU backend, and no deviceless "
                     "GPU compile",
                     "pip install 'jax[cuda12]==<your jax version>' or jax[cuda13] (Linux)", details)
    components = {}
    for name, get, built in (("cuda_runtime", "cuda_runtime_get_version", "cuda_runtime_build_version"),
                             ("cudnn", "cudnn_get_version", "cudnn_build_version"),
                             ("cublas", "cublas_get_version", "cublas_build_version"),
                             ("cufft", "cufft_get_version", "cufft_build_version"),
                             ("cusparse", "cusparse_get_version", "cusparse_build_version")):
        entry: dict[str, Any] = {}  # versions (int or None) and an "error" line
        for key, fn in (("installed", get), ("jaxlib_built_with", built)):
            try:
                entry[key] = int(getattr(cv, fn)())
            except Exception as e:  # noqa: BLE001 -- a library that does not load is reported, not raised
                entry[key] = None
                entry["error"] = str(e).splitlines()[0][:200]
        components[name] = entry
    try:
        driver_cuda = int(cv.cuda_driver_get_version())
    except Exception:  # noqa: BLE001
        driver_cuda = 0
    details.update({"cuda_components": components, "driver_cuda_version": _fmt_version(driver_cuda, "driver")})
    # The plugin's own check (what `import jax` runs on a GPU machine unless JAX_SKIP_CUDA_CONSTRAINTS_CHECK is set).
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            plugin._check_cuda_versions(raise_on_first_error=False, debug=True)
        plugin_error = None
    except Exception as e:  # noqa: BLE001 -- the plugin raises RuntimeError listing every problem
        plugin_error = str(e).strip()
    details["plugin_check"] = {"error": plugin_error, "debug": buf.getvalue().strip()}
    shown = ", ".join(f"{k} {_fmt_version(v['installed'], k)} (jaxlib built with "
                      f"{_fmt_version(v['jaxlib_built_with'], k)})"
                      for k, v in components.items() if v.get("installed"))
    if plugin_error and not driver_cuda:
        # cuInit needs a driver: the plugin cannot finish its check here; the versions are still shown.
        status = "fail" if gpu_present else "skip"
        return Check("versions", status, f"the CUDA plugin's version check needs an NVIDIA driver (none loads here); "
                     f"installed: {shown}; NCCL {versions['nccl']}",
                     "install the NVIDIA driver (or start the container with --gpus all)" if gpu_present else "",
                     details)
    if plugin_error:
        return Check("versions", "fail", "the CUDA plugin's own check fails: " + " | ".join(
                     line for line in plugin_error.splitlines() if line.strip() and not line.startswith("-"))[:900],
                     INSTALL + "; and unset LD_LIBRARY_PATH entries that point at another CUDA", details)
    runtime_v = components["cuda_runtime"].get("installed") or 0
    summary = (f"jax/jaxlib/plugin {versions['jaxlib']}; {shown}; NCCL {versions['nccl']}; driver supports CUDA "
               f"{_fmt_version(driver_cuda, 'driver')}")
    if driver_cuda and runtime_v and driver_cuda < runtime_v:
        return Check("versions", "warn", summary + f": older than the CUDA runtime {_fmt_version(runtime_v)} -- runs "
                     "under CUDA's minor-version compatibility, but XLA then compiles PTX serially (slower compiles)",
                     "update the NVIDIA driver to one that supports CUDA " + str(_fmt_version(runtime_v)), details)
    return Check("versions", "pass", summary, "", details)


# ---------------------------------------------------------------- smoke test


def smoke_child() -> dict:
    """In a fresh process: a tiny Flax model and batch on the default device, one jitted forward and
    backward; where everything lives. Printed as one JSON line."""

    backend = jax.default_backend()
    dev = jax.devices()[0]

    class Tiny(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(nn.relu(nn.Dense(32)(x)))

    model = Tiny()
    x = jax.device_put(jnp.ones((8, 16), jnp.float32), dev)
    params = jax.jit(model.init)(jax.random.key(0), x)

    @jax.jit
    def loss_and_grad(p, batch):
        # (type: ignore: flax types apply() for mutable= too, which returns (output, state))
        return jax.value_and_grad(lambda q: jnp.mean(model.apply(q, batch) ** 2))(p)  # type: ignore[operator]

    loss, grads = loss_and_grad(params, x)
    jax.block_until_ready(grads)

    def platforms(tree):
        return sorted({d.platform for leaf in jax.tree.leaves(tree) for d in leaf.devices()})

    stats = {}
    try:
        stats = {k: int(v) for k, v in (dev.memory_stats() or {}).items()
                 if k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "bytes_reserved", "pool_bytes")}
    except Exception:  # noqa: BLE001 -- the CPU backend has none
        pass
    return {"backend": backend, "device": dev.device_kind, "devices": len(jax.devices()),
            "params_on": platforms(params), "batch_on": platforms(x), "grads_on": platforms(grads),
            "loss": float(loss), "memory_stats": stats, "jax": jax.__version__}


def check_smoke(gpu_count: int) -> Check:
    if not gpu_count:
        return Check("smoke", "skip", "no GPU: nothing to run a step on")
    env = dict(os.environ)
    try:
        proc = subprocess.run([sys.executable, "-m", "jaxmem.truth.doctor", "--smoke"], capture_output=True, text=True,
                              env=env, timeout=SMOKE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return Check("smoke", "fail", f"a tiny jitted step did not finish in {SMOKE_TIMEOUT_S} s",
                     "check `nvidia-smi` for a hung GPU or another process holding it")
    result = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                result = json.loads(line)
                break
    log = [line for line in proc.stderr.splitlines() if line.strip()]
    details = {"result": result, "stderr_tail": log[-8:]}
    if result is None or "error" in (result or {}):
        err = (result or {}).get("error") or (log[-1] if log else f"exit {proc.returncode}")
        return Check("smoke", "fail", f"a tiny jitted forward and backward failed: {err[:400]}",
                     "run `python -c 'import jax; print(jax.devices())'` to see jax's own error; " + INSTALL, details)
    placed = set(result["params_on"]) | set(result["batch_on"]) | set(result["grads_on"])
    if result["backend"] != "gpu" or placed != {"gpu"}:
        why = next((line for line in log if "CUDA" in line or "cuda" in line or "GPU" in line), "")
        return Check("smoke", "fail", f"jax runs on the {result['backend'].upper()} although NVML sees {gpu_count} "
                     f"GPU(s): parameters on {result['params_on']}, batch on {result['batch_on']}, gradients on "
                     f"{result['grads_on']}" + (f" ({why.strip()[:300]})" if why else ""),
                     "unset JAX_PLATFORMS if it names cpu; " + INSTALL, details)
    return Check("smoke", "pass", f"a jitted forward and backward ran on {result['device']}: parameters, batch and "
                 f"gradients on the GPU (loss {result['loss']:.4f})", "", details)


# ---------------------------------------------------------------- memory settings

_MEMORY_FLAGS = re.compile(r"--(xla_gpu_memory_limit_slop_factor|xla_gpu_enable_nccl_user_buffers|"
                           r"xla_gpu_enable_nccl_comm_splitting|xla_gpu_enable_nccl_per_stream_comms|"
                           r"xla_gpu_enable_command_buffer|xla_gpu_enable_while_loop_double_buffering|"
                           r"xla_gpu_graph_min_graph_size|xla_gpu_autotune_level|xla_gpu_enable_latency_hiding_scheduler|"
                           r"xla_gpu_all_gather_combine_threshold_bytes|xla_gpu_reduce_scatter_combine_threshold_bytes|"
                           r"xla_gpu_all_reduce_combine_threshold_bytes|xla_gpu_enable_triton_gemm|"
                           r"xla_gpu_cuda_data_dir|xla_force_host_platform_device_count)\b[^ ]*")
_ENV = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_ALLOCATOR", "TF_GPU_ALLOCATOR", "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES",
        "CUDA_MODULE_LOADING", "NCCL_NVLS_ENABLE", "NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS",
        "NCCL_CUMEM_ENABLE")


def check_memory_settings(gpus: list[dict], env=None) -> Check:
    env = os.environ if env is None else env
    settings = {k: env[k] for k in _ENV if k in env}
    flags = _MEMORY_FLAGS.findall(env.get("XLA_FLAGS", ""))
    settings["XLA_FLAGS (memory-related)"] = [m.group(0) for m in _MEMORY_FLAGS.finditer(env.get("XLA_FLAGS", ""))]
    details: dict[str, Any] = {"settings": settings}
    name = "XLA_CLIENT_MEM_FRACTION" if env.get("XLA_CLIENT_MEM_FRACTION") else "XLA_PYTHON_CLIENT_MEM_FRACTION"
    raw = env.get(name)
    frac = 0.75
    if raw is not None and raw.strip():
        try:
            frac = float(raw)
        except ValueError:
            return Check("memory_settings", "fail", f"{name}={raw!r} is not a number: jax fails when it starts "
                         "its GPU client", f"set {name} to a share of the card in (0, 1], e.g. 0.9, or unset it",
                         details)
        if not 0 < frac <= 1:
            return Check("memory_settings", "fail", f"{name}={raw} is outside (0, 1]",
                         f"set {name} to a share of the card in (0, 1], e.g. 0.9, or unset it", details)
    prealloc = env.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in ("false", "0")
    alloc = env.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower()
    total = gpus[0]["memory_total_bytes"] if gpus else None

    def gib(b: float) -> str:
        return f"{b / 2**30:.1f} GiB"

    card = f" of {gpus[0]['name']} ({gib(total)})" if total else ""
    if alloc == "platform":
        meaning = ("XLA_PYTHON_CLIENT_ALLOCATOR=platform: no pool; every buffer is cudaMalloc'd and freed at once -- "
                   "nvidia-smi shows what is in use, but steps are slower (meant for debugging)")
    elif prealloc:
        pool = f" = {gib(int(total * frac))}" if total else ""
        meaning = (f"JAX reserves {frac:.0%}{card}{pool} when it starts, whatever the model needs: nvidia-smi shows "
                   f"that plus the CUDA context, not what is in use (device.memory_stats()['bytes_in_use'], or "
                   f"`jaxmem verify`); the other {1 - frac:.0%} is all the CUDA context and NCCL's buffers may use")
    else:
        meaning = (f"XLA_PYTHON_CLIENT_PREALLOCATE=false: the pool grows on demand up to {frac:.0%}{card} and is "
                   "not returned -- nvidia-smi shows the pool's high-water mark plus the CUDA context")
    details["meaning"] = meaning
    status, fix = "pass", ""
    notes = []
    if prealloc and alloc != "platform" and frac > 0.95:
        status = "warn"
        notes.append(f"a fraction of {frac} leaves {1 - frac:.0%} of the card outside JAX's pool for the CUDA "
                     "context and NCCL's communicators (about 1.3 GiB each with NVLS): multi-GPU runs may fail in "
                     "NCCL's initialization")
        fix = f"lower {name} to 0.9 or less for multi-GPU training (`jaxmem analyze` shows the runtime's terms)"
    if env.get("TF_GPU_ALLOCATOR") == "cuda_malloc_async":
        notes.append("TF_GPU_ALLOCATOR=cuda_malloc_async: CUDA's stream-ordered allocator instead of the BFC pool")
    if flags:
        details["flags"] = flags
    return Check("memory_settings", status, meaning + ("; " + "; ".join(notes) if notes else ""), fix, details)


# ---------------------------------------------------------------- calibration


def check_calibration(gpus: list[dict]) -> Check:
    """The calibration file analyze reads: valid, and does it cover the GPUs here?"""

    path = calibration.user_path()
    try:
        entries = calibration.read_user(path)
    except UserError as e:
        return Check("calibration", "fail", str(e).split(". Fix")[0], "fix or delete the file, or point "
                     "JAXMEM_CALIBRATION elsewhere; then `jaxmem calibrate --gpu local`", {"path": str(path)})
    details = {"path": str(path), "exists": path.exists(),
               "entries": {k: {"measured_at": v.measured_at, "in_pool_bytes": v.in_pool_bytes,
                               "out_of_pool_bytes": v.out_of_pool_bytes,
                               "nccl_communicator_bytes": v.nccl_communicator_bytes} for k, v in entries.items()}}
    kinds = sorted({g["name"] for g in gpus})
    missing = [k for k in kinds if k not in entries]
    if missing:
        return Check("calibration", "warn", f"no calibration for {', '.join(missing)} in {path}: analyze's runtime "
                     "terms (allocator, CUDA context, NCCL) for this GPU are estimates",
                     "jaxmem calibrate --gpu local", details)
    have = ", ".join(f"{k} ({v.measured_at or 'undated'})" for k, v in entries.items()) or "none"
    return Check("calibration", "pass", f"calibration file {path}: " +
                 (f"valid; entries: {have}" if path.exists() else "none yet (the shipped values are used)"), "",
                 details)


# ---------------------------------------------------------------- deviceless


def check_deviceless() -> Check:
    """One tiny deviceless compile per catalogue GPU (the compile cache off: it must really compile)."""

    done, failed = {}, {}
    for key in targets.CATALOGUE:
        opts = AnalyzeOptions(gpu=key, mesh="data=1", layout="dp", explain=False)
        if "cache" in {f.name for f in dataclasses.fields(AnalyzeOptions)}:
            opts = dataclasses.replace(opts, cache=False)
        try:
            rep = analyze_workload(calibration_workload(width=64, batch=8), opts, source="<doctor>")
            done[key] = {"peak_bytes": rep.per_device_peak_bytes, "compile_s": rep.timings.get("compile_s")}
        except (UserError, Exception) as e:  # noqa: BLE001 -- each target is reported, the others still run
            failed[key] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    details = {"compiled": done, "failed": failed}
    if failed:
        return Check("deviceless", "fail", f"deviceless compile failed for {', '.join(failed)}: "
                     f"{next(iter(failed.values()))}", INSTALL, details)
    return Check("deviceless", "pass", f"a tiny training step compiled devicelessly for every catalogue GPU "
                 f"({', '.join(done)}): `jaxmem analyze` works on this machine", "", details)


# ---------------------------------------------------------------- all


def diagnose(*, require_gpu: bool = False, smoke: bool = True, deviceless: bool = True) -> Diagnosis:
    gpus = check_gpus(require_gpu)
    n = gpus.details.get("gpu_count", 0) if gpus.status == "pass" else 0
    present = gpus.status == "pass" or bool(gpus.details.get("driver_files"))
    checks = [gpus, check_versions(present)]
    checks.append(check_smoke(n) if smoke else Check("smoke", "skip", "skipped (--no-smoke)"))
    checks.append(check_memory_settings(gpus.details.get("gpus") or []))
    checks.append(check_calibration(gpus.details.get("gpus") or []))
    checks.append(check_deviceless() if deviceless else Check("deviceless", "skip", "skipped (--no-compile)"))
    return Diagnosis(tuple(checks))


def render_lines(d: Diagnosis) -> list[str]:
    """The terminal report: one line per check, then its fix."""
    out = []
    for c in d.checks:
        out.append(f"{c.status.upper():<5} {c.name:<16} {c.summary}")
        if c.fix:
            out.append(f"{'':<5} {'':<16} fix: {c.fix}")
    failed = [c.name for c in d.checks if c.status == "fail"]
    out.append(f"{'not ok' if failed else 'ok'}: " + (f"{', '.join(failed)} failed (exit {EXIT_CHECK_FAILED})"
                                                       if failed else "no check failed (exit 0)"))
    return out


def _smoke_main() -> int:
    try:
        result = smoke_child()
    except Exception as e:  # noqa: BLE001 -- reported to the parent as the check's failure
        result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__" and sys.argv[1:] == ["--smoke"]:
    sys.exit(_smoke_main())
