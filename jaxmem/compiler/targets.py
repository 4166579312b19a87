"""Where the step runs: the NVIDIA GPU catalogue, deviceless topologies, the local device.

The catalogue values are XLA's published target specs (docs/how-it-works.md §3). Each one is
rendered to a text-format ``GpuTargetConfigProto`` and compiled against by
``jax.experimental.topologies`` -- no GPU needed. ``device_memory_size`` matters:
XLA:GPU's scheduler and rematerialization budget 80% of it, where a run budgets its allocator's
pool; so the topology is told the run's pool / 0.8 (:func:`xla_device_memory`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

from jaxmem import env
from jaxmem.compiler import allocator
from jaxmem.compiler.catalogue import (  # noqa: F401  (the catalogue's names, re-exported where they were)
    _ALIASES,
    _COMPACT,
    CATALOGUE,
    DEFAULT_GPU,
    PERFORMANCE,
    GpuSpec,
    Performance,
    _compact,
    card_of,
    catalogue_rows,
    machine_gpus,
    performance,
)
from jaxmem.errors import UserError, did_you_mean
from jaxmem.program.divisors import divisors
from jaxmem.report import ReportWarning


@dataclasses.dataclass(frozen=True)
class Target:
    """A resolved compile target: the devices a mesh is built from."""

    gpu: str                   # catalogue key, "local:<device kind>" or "cpu"
    platform: str              # "cuda" or "cpu"
    description: str
    memory_bytes: int | None   # per-device memory; None when the OS decides (cpu)
    deviceless: bool
    devices: tuple             # jax devices (compile-only ones when deviceless)
    hosts: int = 1
    # the device_memory_size the deviceless topology was given (xla_device_memory: the run's pool / 0.8, so
    # that XLA budgets the step as the run does); None off the catalogue (cpu, an attached GPU's own)
    xla_memory_bytes: int | None = None


def resolve_gpu_name(name: str | None) -> str:
    """Normalize --gpu; None means the attached GPU if any, else the default."""
    if name is None:
        return "local" if local_gpu_count() > 0 else DEFAULT_GPU
    key = name.strip().lower()
    if key in ("local", "cpu"):
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    # the spellings people use: "RTX 4090", "rtx4090", "NVIDIA GeForce RTX 4090", "L40S", "rtx_pro_6000"
    compact = _compact(key)
    if compact in _COMPACT:
        return _COMPACT[compact]
    known = ", ".join(sorted(CATALOGUE))
    hint = did_you_mean(key, [*_ALIASES, *CATALOGUE, "local", "cpu"])
    raise UserError(f"unknown GPU {name!r}{hint}. Known: {known}, local (the attached GPU), cpu.")


def local_gpu_count() -> int:
    import jax  # noqa: PLC0415 - jax-free at import: used before jax starts (jaxmem.session)

    try:
        return len(jax.devices("gpu"))
    except RuntimeError:
        return 0


GPUS_PER_HOST = 8   # a card's host when --hosts is not given (DGX/HGX systems hold 8)


def host_count(n_devices: int, hosts: int | None, gpu: str | None = None) -> int:
    """The hosts the mesh's devices are spread over. Given (--hosts), it must divide the devices, and on a
    cloud machine type (catalogue.machine_gpus) put no more in each host than the machine holds. Not
    given: the fewest hosts, of at most the machine's GPUs (8 for a card) each, that split the devices
    evenly (12 devices: 2 hosts of 6; 9: 3 of 3)."""
    per = machine_gpus(gpu) if gpu else None
    if hosts is None:
        cap = per or GPUS_PER_HOST
        if n_devices <= cap:
            return 1
        return next(h for h in divisors(n_devices) if h >= math.ceil(n_devices / cap))
    if n_devices % hosts:
        raise UserError(f"--hosts {hosts} does not divide the {n_devices} devices of the mesh")
    if per is not None and n_devices // hosts > per:
        fewest = next(h for h in divisors(n_devices) if h >= math.ceil(n_devices / per))
        raise UserError(f"--hosts {hosts} puts {n_devices // hosts} of the mesh's {n_devices} devices in each {gpu} "
                        f"machine, which holds {per} GPUs; give --hosts {fewest} (or more hosts that divide "
                        f"{n_devices}), or leave --hosts out: jaxmem then spreads the devices over {fewest} machines")
    return hosts


def topology_string(n_devices: int, hosts: int | None, gpu: str | None = None) -> tuple[str, int]:
    """`slices x hosts x devices_per_host` for n devices (host_count: 8 per host unless told)."""
    hosts = host_count(n_devices, hosts, gpu)
    return f"1x{hosts}x{n_devices // hosts}", hosts


# XLA:GPU budgets a step's temporaries (its scheduler and rematerialization: gpu_hlo_schedule.cc,
# GetSchedulerMemoryLimit) from the module's device_memory_size when one is set, else from this percentage of
# the device description's (in XLA's integers: size * 80 / 100). benchmarks/results/xla-budget.md settles it.
XLA_BASE_PERCENT = 80


def xla_device_memory(total: int, run: allocator.Allocator | None) -> int:
    """The device_memory_size a deviceless topology is given so that XLA budgets the step as a run under the
    allocator `run` does. A run's compile sets the module's device_memory_size to its allocator's bytes_limit
    (jaxlib's PjRt client, set_device_memory_size, when the device has allocator stats with a limit):
    BFC, preallocated or grown, total x fraction (its cap); cuda_async total x fraction too (its stats' bytes_limit
    is the release threshold, though it caps nothing: the compile still budgets that much); the platform
    allocator has no stats (cudaMalloc through the backend's allocator, not XLA's MultiDeviceAdapter; its
    memory_stats() show bytes_limit 0), so XLA takes 80% of the card there, as a deviceless compile of the card
    does. A deviceless compile has no module value to set: the topology is told pool / 0.8, rounded up, whose
    80% in XLA's integer arithmetic is the pool exactly. None (no allocator known): the card's own."""
    if run is None or run.kind == "platform":
        return total
    pool = max(int(total * run.fraction), 1)   # BFC and cuda_async: size_t(total * fraction)
    return -(-pool * 100 // XLA_BASE_PERCENT)


def xla_base(device_memory: int) -> int:
    """What XLA budgets from on a device of `device_memory` (GetSchedulerMemoryLimit's base, before it takes
    the step's inputs and outputs off and applies the slop factor)."""
    return device_memory * XLA_BASE_PERCENT // 100


def compile_base(target: Target) -> int | None:
    """What XLA budgets from when it compiles for `target`: 80% of what the deviceless topology was told (the
    run's pool: xla_device_memory), an attached GPU's bytes_limit (its compile sets the module's); None on CPU."""
    if target.platform != "cuda" or target.memory_bytes is None:
        return None
    if not target.deviceless:
        return target.memory_bytes
    return xla_base(target.xla_memory_bytes or target.memory_bytes)


def target_config(target: Target, device_memory: int | None = None) -> str:
    """The text-format target config of a catalogue target's topology (`device_memory`: another size than the
    one the target was made with, e.g. a compile where XLA rematerializes nothing)."""
    return CATALOGUE[target.gpu].target_config(device_memory or target.xla_memory_bytes)


def make_target(gpu: str | None, n_devices: int, hosts: int | None = None, *,
                run: allocator.Allocator | None = None) -> Target:
    """The devices a mesh is built from. `run`: the allocator the run will use (allocator.read), which decides
    the memory XLA budgets the step against (xla_device_memory); None: the card's whole memory."""
    key = resolve_gpu_name(gpu)
    import jax  # noqa: PLC0415 - jax-free at import: used before jax starts (jaxmem.session)

    if key == "cpu":
        devs = jax.devices("cpu")
        if len(devs) < n_devices:
            raise env.too_few_cpu_devices(n_devices, len(devs))
        return Target("cpu", "cpu", "CPU (host)", None, False, tuple(devs[:n_devices]))
    if key == "local":
        devs = jax.devices("gpu") if local_gpu_count() else []
        if not devs:
            raise UserError("--gpu local: no GPU is attached to this machine. Pick a catalogue GPU (jaxmem gpus) "
                            "or --gpu cpu.")
        if len(devs) < n_devices:
            raise UserError(f"--gpu local: the mesh needs {n_devices} devices but {len(devs)} GPUs are attached")
        stats = devs[0].memory_stats() or {}
        return Target(f"local:{devs[0].device_kind}", "cuda", devs[0].device_kind,
                      stats.get("bytes_limit"), False, tuple(devs[:n_devices]))
    spec = CATALOGUE[key]
    topo_str, hosts = topology_string(n_devices, hosts, spec.key)
    memory = xla_device_memory(spec.memory_bytes, run)
    try:
        devices = _deviceless_devices(spec.target_config(memory), topo_str)
    except Exception as e:  # noqa: BLE001 -- the plugin missing is an install problem, not a bug
        if env.jax_started_without_switch():  # installed, but refused when jax started: say so, not "install"
            raise env.started_too_early(f"cannot build a deviceless {spec.key} topology") from None
        raise UserError(
            f"cannot build a deviceless {spec.key} topology ({type(e).__name__}: {str(e).splitlines()[0]}). "
            "Deviceless GPU compilation needs the CUDA plugin of your jax: "
            "pip install 'jax[cuda12]==<your jax version>' (or jax[cuda13]; Linux)."
        ) from None
    return Target(spec.key, "cuda", spec.description, spec.memory_bytes, True, devices, hosts, memory)


_CONFIGS: dict[int, str] = {}   # id of a compile-only device -> the target config of its topology


def deviceless_config(device) -> str | None:
    """The target config the compile-only `device` was made with (its memory size is XLA's budget: the
    compile cache keys by it); None for any other device."""
    return _CONFIGS.get(id(device))


@functools.cache
def _deviceless_devices(target_config: str, topology: str) -> tuple:
    """The compile-only devices of one topology, made once per process: every mesh built for the same
    target holds the same devices (a mesh the model's own code built from jax.devices() while its
    workload() ran is the step's mesh then, not another topology's equal-looking one)."""
    # jax-free at import: used before jax starts (jaxmem.session)
    from jax.experimental import topologies  # noqa: PLC0415

    devices = tuple(topologies.get_topology_desc(platform="cuda", target_config=target_config,
                                                 topology=topology).devices)
    _CONFIGS.update((id(d), target_config) for d in devices)   # kept alive by this cache: ids stay theirs
    return devices


def ensure_host_devices(n: int) -> None:
    """Ask XLA for n CPU devices; only effective before jax initializes its backends."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def usable_fraction() -> tuple[float, str]:
    """The share of a card JAX's allocator may use, under the settings in force, and what set it
    (jaxmem.compiler.allocator.read: JAX's GPU memory docs and jaxlib's xla_client.py). By default JAX
    preallocates 75% of the card; with the BFC allocator that stays the limit when preallocation is off;
    XLA_CLIENT_MEM_FRACTION (formerly XLA_PYTHON_CLIENT_MEM_FRACTION) changes the share; under cuda_async the
    share is the pool's release threshold; XLA_PYTHON_CLIENT_ALLOCATOR=platform allocates on demand from the
    whole card (1.0)."""
    a = allocator.read(os.environ)
    return a.fraction, a.note


# Every CPU report says which program it predicts (docs/how-it-works.md, "XLA:CPU's YNNPACK fusions").
CPU_FUSIONS_OFF = (
    "--gpu cpu predicts the step compiled with XLA:CPU's YNNPACK fusions off, as jaxmem compiles it: their run-time "
    "scratch is invisible to XLA's buffer assignment, and a plain jax.jit (fusions on) can peak much higher "
    "(benchmarks/results/accuracy-cpu.md). To run the predicted program in your own training, turn them off: "
    "jax.jit(step, ..., compiler_options={'xla_cpu_experimental_ynn_fusion_type': ''}) or, for the whole process, "
    "XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=")


def check_cpu_fusions(target: Target) -> list[ReportWarning]:
    """cpu_fusions_off: every CPU report says which program it predicts."""
    return [ReportWarning("cpu_fusions_off", CPU_FUSIONS_OFF)] if target.platform == "cpu" else []


def host_fits(host: dict[str, int], gpu: str) -> bool:
    """Pinned host memory within the reference system's RAM per GPU (Performance.host_memory)."""
    perf = performance(gpu)
    total = sum(host.values())
    return not total or perf is None or perf.host_memory is None or total <= perf.host_memory


def check_host_memory(host: dict[str, int], gpu: str) -> list[ReportWarning]:
    """host_memory_exceeded: more pinned host memory per device than the reference system has per GPU."""
    if host_fits(host, gpu):
        return []
    perf = performance(gpu)
    assert perf is not None and perf.host_memory is not None
    total = sum(host.values())
    return [ReportWarning(
        "host_memory_exceeded", f"{total / 2**30:.1f} GiB of pinned host memory per device exceeds the "
        f"{perf.host_memory / 2**30:.0f} GiB per GPU of the reference system's RAM (jaxmem gpus --json: host_memory): "
        "offload less (fewer offloaded names, --remat full) or spread the state over more devices",
        total - perf.host_memory)]
