"""Where the step runs: the NVIDIA GPU catalogue, deviceless topologies, the local device.

The catalogue values are XLA's published target specs (docs/how-it-works.md §3). Each one is
rendered to a text-format ``GpuTargetConfigProto`` and compiled against by
``jax.experimental.topologies`` -- no GPU needed. ``device_memory_size`` matters:
XLA:GPU's scheduler and rematerialization budget about 80% of it.
"""

from __future__ import annotations

import dataclasses
import math
import os

from jaxmem.errors import UserError, did_you_mean


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    key: str
    description: str          # what CUDA reports as the device name
    memory_bytes: int
    compute_capability: tuple[int, int]
    core_count: int
    fpus_per_core: int
    shared_memory_per_core: int
    shared_memory_per_block_optin: int
    threads_per_core_limit: int
    memory_bandwidth: int
    l2_cache_size: int
    clock_rate_ghz: float
    aliases: tuple[str, ...] = ()

    def target_config(self) -> str:
        """Text-format GpuTargetConfigProto, naming the CUDA runtime and cuDNN the installed CUDA
        plugin was built against (as a real device of that stack would report them; XLA gates some
        rewrites on them, e.g. cuDNN fusions and FP8 cuBLASLt). Only fields every supported jaxlib's
        proto knows."""
        from jaxmem.compiler import versions

        cc_major, cc_minor = self.compute_capability
        cuda, cudnn, _ = versions.target_versions()
        return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_memory_per_core}
  threads_per_core_limit: {self.threads_per_core_limit}
  core_count: {self.core_count}
  fpus_per_core: {self.fpus_per_core}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {self.memory_bandwidth}
  l2_cache_size: {self.l2_cache_size}
  clock_rate_ghz: {self.clock_rate_ghz}
  device_memory_size: {self.memory_bytes}
  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}
  cuda_compute_capability {{ major: {cc_major} minor: {cc_minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: {cudnn[0]} minor: {cudnn[1]} }}
runtime_version {{ major: {cuda[0]} minor: {cuda[1]} patch: {cuda[2]} }}
device_description_str: "{self.description}"
"""


CATALOGUE: dict[str, GpuSpec] = {
    s.key: s
    for s in (
        GpuSpec("a100-80g", "NVIDIA A100-SXM4-80GB", 85100068864, (8, 0), 108, 64, 167936, 166912, 2048,
                2039040000000, 41943040, 1.41, ("a100", "a100-sxm-80g")),
        GpuSpec("h100", "NVIDIA H100 80GB HBM3", 84942979072, (9, 0), 132, 128, 233472, 232448, 2048,
                3352320000000, 52428800, 1.98, ("h100-80g", "h100-sxm")),
        GpuSpec("h200", "NVIDIA H200 141GB HBM3e", 151397597184, (9, 0), 132, 128, 233472, 232448, 2048,
                4800000000000, 52428800, 1.98, ("h200-141g",)),
        GpuSpec("b200", "NVIDIA B200", 191514411008, (10, 0), 148, 128, 233472, 232448, 2048,
                7672320000000, 132644864, 1.965, ()),
        # GH200 (96 GB HBM3): XLA ships no spec file for it; the H100 die's values, NVIDIA's 4 TB/s, and
        # the 97,871 MiB total that nvidia-smi prints on GH200 machines
        GpuSpec("gh200", "NVIDIA GH200 480GB", 102625181696, (9, 0), 132, 128, 233472, 232448, 2048,
                4000000000000, 52428800, 1.98, ("gh200-96g",)),
        # XLA's own spec (xla/backends/gpu/target_config/specs/gb200.txtpb)
        GpuSpec("gb200", "NVIDIA GB200", 197897748480, (10, 0), 152, 128, 233472, 232448, 2048,
                7928064000000, 135528448, 2.062, ("gb200-nvl72",)),
        GpuSpec("rtx-a6000", "NVIDIA RTX A6000", 51041271808, (8, 6), 84, 128, 102400, 101376, 1536,
                768096000000, 6291456, 1.8, ("a6000",)),
    )
}
_ALIASES = {a: s.key for s in CATALOGUE.values() for a in (s.key, *s.aliases)}
DEFAULT_GPU = "h100"


@dataclasses.dataclass(frozen=True)
class Performance:
    """Published peak rates of one GPU, for the step-time estimate (jaxmem.compiler.steptime).

    FLOP/s are dense (NVIDIA's datasheets also print 2x "with sparsity" numbers: not used).
    Bandwidths are bytes/s per GPU in one direction: NVIDIA prints NVLink as the
    bidirectional total (900 GB/s on H100 = 450 GB/s each way); a ring collective sends and
    receives at the one-way rate at the same time.
    """

    bf16_flops: float            # dense bf16 tensor-core FLOP/s (fp16 runs at the same rate on every card here)
    tf32_flops: float            # dense TF32 tensor-core FLOP/s: fp32 dots at JAX's default precision
    fp32_flops: float            # fp32 non-tensor FLOP/s (fp32 dots at precision=HIGHEST)
    hbm_bandwidth: float         # device-memory bytes/s
    intra_host_bandwidth: float  # bytes/s per GPU, one way, to GPUs of the same host
    inter_host_bandwidth: float  # bytes/s per GPU, one way, to GPUs of other hosts
    intra_host_link: str
    inter_host_link: str
    sources: tuple[tuple[str, str], ...]   # (fields, published source)
    host_bandwidth: float = 0.0  # bytes/s per GPU, one way, to the host's memory (PCIe): offloaded state
    fp8_flops: float | None = None   # dense fp8 tensor-core FLOP/s (None: no fp8 tensor cores)
    int8_ops: float | None = None    # dense int8 tensor-core OP/s
    # the reference system's memory per GPU (its RAM / its GPUs): what pinned host buffers may take
    host_memory: int | None = None
    # GPUs one NVLink switch fabric joins across hosts (None: the host is the NVLink domain); a
    # collective inside it runs at the NVLink rate whatever --hosts says
    nvlink_domain: int | None = None


# DGX A100 (640 GB), H100, H200 and B200 user guides: 2 TB of system memory for 8 GPUs (read as 2 TiB)
_DGX_RAM = 2**41 // 8
_DGX_RAM_SOURCE = "NVIDIA DGX {0} user guide: 2 TB system memory for 8 GPUs (256 GiB per GPU, read as 2 TiB)"
_DGX_NET = "NVIDIA DGX {0} user guide: 8 x ConnectX-7 400 Gb/s InfiniBand, one per GPU (50 GB/s each way)"
PERFORMANCE: dict[str, Performance] = {
    "a100-80g": Performance(
        312e12, 156e12, 19.5e12, 2.039e12, 300e9, 25e9, "NVLink 3", "HDR InfiniBand 200 Gb/s per GPU",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, intra_host_bandwidth",
          ("NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: BF16 312 TFLOPS (624 sparse), TF32 156 (312 sparse), "
          "FP32 19.5 TFLOPS, 2,039 GB/s HBM2e, NVLink 600 GB/s (bidirectional)")),
         ("inter_host_bandwidth", ("NVIDIA DGX A100 user guide: 8 x ConnectX-6 200 Gb/s HDR InfiniBand for compute, "
          "one per GPU (25 GB/s each way)")),
         ("host_bandwidth", "NVIDIA A100 datasheet: PCIe Gen4 64 GB/s (bidirectional), 32 GB/s each way"),
         ("host_memory", _DGX_RAM_SOURCE.format("A100")),
         ("int8_ops", "NVIDIA A100 datasheet: INT8 Tensor Core 624 TOPS dense (1,248 sparse); Ampere has no FP8")),
        host_bandwidth=32e9, int8_ops=624e12, host_memory=_DGX_RAM),
    "h100": Performance(
        989.4e12, 494.7e12, 66.9e12, 3.35e12, 450e9, 50e9, "NVLink 4", "NDR InfiniBand 400 Gb/s per GPU",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, intra_host_bandwidth",
          ("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 1,979 TFLOPS with sparsity (989.4 dense), "
           "TF32 989 with sparsity (494.7 dense), FP32 67 TFLOPS, 3.35 TB/s HBM3, NVLink 900 GB/s (bidirectional)")),
         ("inter_host_bandwidth", _DGX_NET.format("H100")),
         ("host_bandwidth", "NVIDIA H100 datasheet: PCIe Gen5 128 GB/s (bidirectional), 64 GB/s each way"),
         ("host_memory", _DGX_RAM_SOURCE.format("H100")),
         ("fp8_flops, int8_ops", ("NVIDIA H100 datasheet, H100 SXM: FP8 3,958 TFLOPS and INT8 3,958 TOPS with sparsity "
          "(1,979 dense)"))),
        host_bandwidth=64e9, fp8_flops=1978.9e12, int8_ops=1978.9e12, host_memory=_DGX_RAM),
    "h200": Performance(
        989.4e12, 494.7e12, 66.9e12, 4.8e12, 450e9, 50e9, "NVLink 4", "NDR InfiniBand 400 Gb/s per GPU",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, intra_host_bandwidth",
          ("NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 1,979 TFLOPS with sparsity (989.4 dense), "
           "TF32 989 with sparsity (494.7 dense), FP32 67 TFLOPS, 4.8 TB/s HBM3e, NVLink 900 GB/s (bidirectional)")),
         ("inter_host_bandwidth", _DGX_NET.format("H200")),
         ("host_bandwidth", "NVIDIA H200 datasheet: PCIe Gen5 128 GB/s (bidirectional), 64 GB/s each way"),
         ("host_memory", _DGX_RAM_SOURCE.format("H200")),
         ("fp8_flops, int8_ops", ("NVIDIA H200 datasheet, H200 SXM: FP8 3,958 TFLOPS and INT8 3,958 TOPS with sparsity "
          "(1,979 dense)"))),
        host_bandwidth=64e9, fp8_flops=1978.9e12, int8_ops=1978.9e12, host_memory=_DGX_RAM),
    "b200": Performance(
        2.25e15, 1.1e15, 75e12, 7.7e12, 900e9, 50e9, "NVLink 5", "NDR InfiniBand 400 Gb/s per GPU",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, intra_host_bandwidth",
          ("NVIDIA HGX B200 specifications (per GPU): FP16/BF16 4.5 PFLOPS with sparsity (2.25 dense), TF32 2.2 "
           "PFLOPS with sparsity (1.1 dense), FP32 75 TFLOPS, 7.7 TB/s HBM3e, NVLink 5 1.8 TB/s (bidirectional)")),
         ("inter_host_bandwidth", _DGX_NET.format("B200")),
         ("host_bandwidth", "NVIDIA HGX B200 specifications: PCIe Gen5 128 GB/s (bidirectional), 64 GB/s each way"),
         ("host_memory", _DGX_RAM_SOURCE.format("B200")),
         ("fp8_flops, int8_ops", ("NVIDIA HGX B200 specifications (per GPU): FP8 9 PFLOPS and INT8 9 POPS with "
          "sparsity (4.5 dense)"))),
        host_bandwidth=64e9, fp8_flops=4.5e15, int8_ops=4.5e15, host_memory=_DGX_RAM),
    "gh200": Performance(
        989.4e12, 494.7e12, 66.9e12, 4.0e12, 450e9, 50e9, "NVLink 4 (NVLink Switch System)",
        "NDR InfiniBand 400 Gb/s per superchip",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, intra_host_bandwidth",
          ("NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3): BF16 1,979 TFLOPS with sparsity (989.4 "
           "dense), TF32 989 with sparsity (494.7 dense), FP32 67 TFLOPS, 4 TB/s HBM3; NVIDIA DGX GH200: NVLink 4 "
           "900 GB/s (bidirectional) per GPU through the NVLink Switch System")),
         ("nvlink_domain", "NVIDIA DGX GH200: 256 superchips in one NVLink domain"),
         ("inter_host_bandwidth", "NVIDIA DGX GH200: one ConnectX-7 400 Gb/s per superchip (50 GB/s each way)"),
         ("host_bandwidth", ("NVIDIA GH200 datasheet: NVLink-C2C 900 GB/s (bidirectional) to the Grace CPU, "
                             "450 GB/s each way")),
         ("host_memory", "NVIDIA GH200 datasheet: up to 480 GB LPDDR5X per superchip (one GPU)"),
         ("fp8_flops, int8_ops", ("NVIDIA GH200 datasheet: FP8 3,958 TFLOPS and INT8 3,958 TOPS with sparsity "
          "(1,979 dense)"))),
        host_bandwidth=450e9, fp8_flops=1978.9e12, int8_ops=1978.9e12, host_memory=480 * 10**9, nvlink_domain=256),
    "gb200": Performance(
        2.5e15, 1.25e15, 80e12, 8e12, 900e9, 50e9, "NVLink 5 (NVL72)", "NDR InfiniBand 400 Gb/s per GPU",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, intra_host_bandwidth",
          ("NVIDIA GB200 NVL72 specifications, per rack of 72 GPUs: FP16/BF16 360 PFLOPS with sparsity (2.5 "
           "dense per GPU), TF32 180 PFLOPS with sparsity (1.25 dense per GPU), FP32 5,760 TFLOPS (80 per GPU), "
           "HBM3e 576 TB/s (8 per GPU), NVLink 130 TB/s (1.8 TB/s bidirectional per GPU)")),
         ("nvlink_domain", "NVIDIA GB200 NVL72: 72 GPUs in one NVLink domain"),
         ("inter_host_bandwidth", "NVIDIA DGX GB200 user guide: ConnectX-7 400 Gb/s per GPU (50 GB/s each way)"),
         ("host_bandwidth", ("NVIDIA GB200 NVL72 specifications: NVLink-C2C 900 GB/s (bidirectional) per Grace "
          "CPU, which two GPUs share: 225 GB/s each way per GPU (an even split, assumed)")),
         ("host_memory", "NVIDIA GB200 NVL72 specifications: 17 TB LPDDR5X per 72 GPUs (236 GB per GPU)"),
         ("fp8_flops, int8_ops", ("NVIDIA GB200 NVL72 specifications: FP8/FP6 720 PFLOPS and INT8 720 POPS with "
          "sparsity per rack (5 dense per GPU)"))),
        host_bandwidth=225e9, fp8_flops=5e15, int8_ops=5e15, host_memory=17 * 10**12 // 72, nvlink_domain=72),
    "rtx-a6000": Performance(
        154.8e12, 77.4e12, 38.7e12, 768e9, 32e9, 25e9, "PCIe 4.0 x16", "200 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth",
          ("NVIDIA RTX A6000 datasheet / Ampere GA102 whitepaper: BF16 tensor with FP32 accumulate 154.8 TFLOPS "
          "(309.7 sparse), TF32 tensor 77.4 (154.8 sparse), FP32 38.7 TFLOPS, 768 GB/s GDDR6")),
         ("intra_host_bandwidth", ("PCIe 4.0 x16: 64 GB/s bidirectional (32 GB/s each way); the A6000's NVLink "
          "bridge joins pairs of cards only, so an 8-GPU host talks over PCIe")),
         ("inter_host_bandwidth", ("no NVIDIA reference system for RTX A6000 hosts: assumed one 200 Gb/s NIC per "
          "GPU, as in DGX A100")),
         ("host_bandwidth", "NVIDIA RTX A6000 datasheet: PCIe Gen4 x16, 32 GB/s each way"),
         ("int8_ops", "Ampere GA102 whitepaper, RTX A6000: INT8 tensor 309.7 TOPS dense (619.4 sparse); no FP8")),
        host_bandwidth=32e9, int8_ops=309.7e12),
}


def performance(gpu: str) -> Performance | None:
    """The published peak rates of a catalogue GPU (None for cpu / unknown local cards)."""
    if gpu.startswith("local:"):
        desc = gpu[len("local:"):]
        gpu = next((s.key for s in CATALOGUE.values() if s.description == desc), gpu)
    return PERFORMANCE.get(gpu)


def catalogue_rows() -> list[dict]:
    """The catalogue as `jaxmem gpus --json` prints it: each GPU with the published peak rates the
    step-time estimate uses, each rate with its source."""
    def perf(key):
        p = performance(key)
        return None if p is None else {**dataclasses.asdict(p), "sources": [{"fields": f, "source": src}
                                                                          for f, src in p.sources]}

    return [{"name": s.key, "description": s.description, "memory_bytes": s.memory_bytes,
             "compute_capability": ".".join(map(str, s.compute_capability)), "aliases": list(s.aliases),
             "default": s.key == DEFAULT_GPU, "performance": perf(s.key)} for s in CATALOGUE.values()]


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


def resolve_gpu_name(name: str | None) -> str:
    """Normalize --gpu; None means the attached GPU if any, else the default."""
    if name is None:
        return "local" if local_gpu_count() > 0 else DEFAULT_GPU
    key = name.strip().lower()
    if key in ("local", "cpu"):
        return key
    if key not in _ALIASES:
        known = ", ".join(sorted(CATALOGUE))
        hint = did_you_mean(key, [*_ALIASES, "local", "cpu"])
        raise UserError(f"unknown GPU {name!r}{hint}. Known: {known}, local (the attached GPU), cpu.")
    return _ALIASES[key]


def local_gpu_count() -> int:
    import jax

    try:
        return len(jax.devices("gpu"))
    except RuntimeError:
        return 0


def topology_string(n_devices: int, hosts: int | None) -> tuple[str, int]:
    """`slices x hosts x devices_per_host` for n devices (8 per host unless told)."""
    if hosts is None:
        hosts = max(1, math.ceil(n_devices / 8)) if n_devices > 8 else 1
    if n_devices % hosts:
        raise UserError(f"--hosts {hosts} does not divide the {n_devices} devices of the mesh")
    return f"1x{hosts}x{n_devices // hosts}", hosts


def make_target(gpu: str | None, n_devices: int, hosts: int | None = None) -> Target:
    key = resolve_gpu_name(gpu)
    import jax

    if key == "cpu":
        devs = jax.devices("cpu")
        if len(devs) < n_devices:
            from jaxmem import env

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
    topo_str, hosts = topology_string(n_devices, hosts)
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="cuda", target_config=spec.target_config(), topology=topo_str)
    except Exception as e:  # noqa: BLE001 -- the plugin missing is an install problem, not a bug
        from jaxmem import env

        if env.jax_started_without_switch():  # installed, but refused when jax started: say so, not "install"
            raise env.started_too_early(f"cannot build a deviceless {spec.key} topology") from None
        raise UserError(
            f"cannot build a deviceless {spec.key} topology ({type(e).__name__}: {str(e).splitlines()[0]}). "
            "Deviceless GPU compilation needs the CUDA plugin of your jax: "
            "pip install 'jax[cuda12]==<your jax version>' (or jax[cuda13]; Linux)."
        ) from None
    return Target(spec.key, "cuda", spec.description, spec.memory_bytes, True, tuple(topo.devices), hosts)


def ensure_host_devices(n: int) -> None:
    """Ask XLA for n CPU devices; only effective before jax initializes its backends."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def usable_fraction() -> tuple[float, str]:
    """The share of a card JAX's allocator may use, under the settings in force.

    JAX's GPU memory docs: by default JAX preallocates 75% of the card; with the
    BFC allocator that stays the limit when preallocation is off;
    XLA_CLIENT_MEM_FRACTION (formerly XLA_PYTHON_CLIENT_MEM_FRACTION) changes the
    share; XLA_PYTHON_CLIENT_ALLOCATOR=platform allocates on demand from the whole card.
    """
    alloc = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower()
    prealloc = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in ("false", "0")
    if alloc == "platform":
        return 1.0, "XLA_PYTHON_CLIENT_ALLOCATOR=platform: on-demand allocation from the whole card"
    # jaxlib 0.10.2 reads XLA_CLIENT_MEM_FRACTION, and the deprecated name as a fallback.
    name = "XLA_CLIENT_MEM_FRACTION" if os.environ.get("XLA_CLIENT_MEM_FRACTION") else "XLA_PYTHON_CLIENT_MEM_FRACTION"
    frac_env = os.environ.get(name)
    if frac_env:
        try:
            frac = float(frac_env)
        except ValueError:
            raise UserError(f"{name}={frac_env!r} is not a number") from None
        src = f"{name}={frac_env}"
    else:
        frac, src = 0.75, "JAX default: 75% of the card"
    mode = "preallocated" if prealloc else "grown on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false)"
    return frac, f"{src}, {mode}"
