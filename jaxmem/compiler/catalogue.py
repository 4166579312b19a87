"""The NVIDIA GPU catalogue: each card's XLA target spec and published rates, every figure with its
public source (`jaxmem gpus --json`). Data only, and jax-free: the CLI reads it before jax starts."""

from __future__ import annotations

import dataclasses


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
    # (fields, public source) of this spec's own figures: memory_bytes, compute_capability,
    # core_count, memory_bandwidth, ... (jaxmem gpus --json); the rates' are Performance.sources
    sources: tuple[tuple[str, str], ...] = ()

    def target_config(self, device_memory: int | None = None) -> str:
        """Text-format GpuTargetConfigProto, naming the CUDA runtime and cuDNN the installed CUDA
        plugin was built against (as a real device of that stack would report them; XLA gates some
        rewrites on them, e.g. cuDNN fusions and FP8 cuBLASLt). Only fields every supported jaxlib's
        proto knows. `device_memory`: the device_memory_size XLA is told (default: the card's; jaxmem gives
        the run's pool / 0.8 so that XLA's budget is the run's: jaxmem.compiler.targets.xla_device_memory)."""
        # versions imports jax; the catalogue is jax-free at import: used before jax starts (jaxmem.session)
        from jaxmem.compiler import versions  # noqa: PLC0415

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
  device_memory_size: {device_memory or self.memory_bytes}
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


# Cards beyond XLA's own specs (issue 38). memory_bytes is what the card reports: XLA's spec file where
# it ships one (its device_memory_size, CUDA's figure), else nvidia-smi's memory.total (NVML, MiB) as
# printed on that card -- CUDA's own total is a little lower (H100 80GB: 81,559 MiB in nvidia-smi,
# 81,008 MiB from CUDA, 0.7%), said in the source. SM-level fields (shared memory, threads per SM)
# are the CUDA C++ Programming Guide's table for the compute capability.
_GUIDE = "CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability'"
_SMI = ("nvidia-smi memory.total {0:,} MiB as printed on this card (NVML; CUDA's total is up to ~1% lower: "
        "the fit verdict may be that much optimistic)")


def _sm(cc: str, smem: int, threads: int) -> tuple[str, str]:
    return ("shared_memory_per_core, shared_memory_per_block_optin, threads_per_core_limit",
            (f"{_GUIDE}: compute capability {cc}: {smem} KB shared memory per SM, 99 KB per block (opt-in), "
            f"{threads} threads per SM"))


_MORE_CARDS = (
    GpuSpec("rtx-3090", "NVIDIA GeForce RTX 3090", 25447170048, (8, 6), 82, 128, 102400, 101376, 1536,
            936192000000, 6291456, 1.695, ("3090",),
            (("memory_bytes", "CUDA deviceQuery on an RTX 3090: 24268 MBytes (25447170048 bytes) of global memory"),
             ("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz",
              ("NVIDIA Ampere GA102 GPU architecture whitepaper, Appendix A (GeForce RTX 3090): 82 SMs, boost "
              "1,695 MHz, 936 GB/s GDDR6X, 6 MB L2; compute capability 8.6 (developer.nvidia.com/cuda-gpus)")),
             _sm("8.6", 100, 1536))),
    GpuSpec("rtx-4090", "NVIDIA GeForce RTX 4090", 24564 * 2**20, (8, 9), 128, 128, 102400, 101376, 1536,
            1008000000000, 75497472, 2.52, ("4090",),
            (("memory_bytes", _SMI.format(24564)),
             ("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz",
              ("NVIDIA Ada GPU architecture whitepaper (v2.1), Appendix A (GeForce RTX 4090): 128 SMs, "
              "boost 2,520 MHz, 1,008 GB/s GDDR6X, 72 MB L2; compute capability 8.9 (developer.nvidia.com/cuda-gpus)")),
             _sm("8.9", 100, 1536))),
    GpuSpec("rtx-5090", "NVIDIA GeForce RTX 5090", 32607 * 2**20, (12, 0), 170, 128, 131072, 101376, 1536,
            1792000000000, 100663296, 2.407, ("5090",),
            (("memory_bytes", _SMI.format(32607)),
             ("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz",
              ("NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090): 170 SMs, boost 2,407 MHz, "
              "1,792 GB/s GDDR7, 96 MB L2; compute capability 12.0 (developer.nvidia.com/cuda-gpus)")),
             ("shared_memory_per_core, shared_memory_per_block_optin, threads_per_core_limit",
              "XLA's spec for the same GB202 die (xla/backends/gpu/target_config/specs/rtx6000pro.txtpb)"))),
    GpuSpec("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", 49140 * 2**20, (8, 9), 142, 128, 102400, 101376, 1536,
            960000000000, 100663296, 2.505, ("6000-ada",),
            (("memory_bytes", _SMI.format(49140)),
             ("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz",
              ("NVIDIA RTX 6000 Ada Generation datasheet: 48 GB GDDR6 with ECC, 960 GB/s, 18,176 CUDA cores (142 SMs); "
              "Ada whitepaper: 96 MB L2 (AD102), boost 2,505 MHz; compute capability 8.9")),
             _sm("8.9", 100, 1536))),
    GpuSpec("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887 * 2**20, (12, 0), 188, 128, 131072,
            101376, 1536, 1792000000000, 134217728, 2.6,
            ("rtx-pro-6000-blackwell", "rtx-6000-pro"),
            (("memory_bytes", _SMI.format(97887) + "; XLA's spec rounds it to 96 GiB"),
             (("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz, "
              "shared_memory_per_core, shared_memory_per_block_optin, threads_per_core_limit"),
              ("XLA's spec xla/backends/gpu/target_config/specs/rtx6000pro.txtpb (188 SMs, 1,792 GB/s, 128 MB L2, "
              "2.6 GHz, compute capability 12.0); NVIDIA RTX PRO 6000 Blackwell datasheet: 96 GB GDDR7 with ECC")))),
    GpuSpec("l40s", "NVIDIA L40S", 46068 * 2**20, (8, 9), 142, 128, 102400, 101376, 1536,
            864000000000, 100663296, 2.52, (),
            (("memory_bytes", _SMI.format(46068) + " (ECC on, the data-center default)"),
             ("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz",
              ("NVIDIA L40S datasheet: 48 GB GDDR6 with ECC, 864 GB/s, 18,176 CUDA cores (142 SMs); Ada whitepaper: "
              "96 MB L2 (AD102); boost 2,520 MHz; compute capability 8.9")),
             _sm("8.9", 100, 1536))),
    GpuSpec("l4", "NVIDIA L4", 23034 * 2**20, (8, 9), 58, 128, 102400, 101376, 1536,
            300000000000, 50331648, 2.04, (),
            (("memory_bytes", _SMI.format(23034) + " (ECC on)"),
             ("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz",
              ("NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, 7,424 CUDA cores (58 SMs, AD104: 48 MB L2), boost 2,040 "
              "MHz; compute capability 8.9")),
             _sm("8.9", 100, 1536))),
    GpuSpec("a10g", "NVIDIA A10G", 23028 * 2**20, (8, 6), 80, 128, 102400, 101376, 1536,
            600000000000, 6291456, 1.71, (),
            (("memory_bytes", _SMI.format(23028) + " (AWS G5 instances)"),
             ("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz",
              ("AWS EC2 G5 instance page: NVIDIA A10G, 24 GB GDDR6; NVIDIA publishes no A10G datasheet: 80 SMs, "
              "1,710 MHz boost and 600 GB/s as the A10's GA102 (NVIDIA A10 datasheet: 600 GB/s); compute "
              "capability 8.6")),
             _sm("8.6", 100, 1536))),
    GpuSpec("a100-40g", "NVIDIA A100-SXM4-40GB", 42331013120, (8, 0), 108, 64, 167936, 166912, 2048,
            1555200000000, 41943040, 1.41, ("a100-40gb", "a100-sxm-40g"),
            ((("memory_bytes, compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz, "
              "shared_memory_per_core, shared_memory_per_block_optin, threads_per_core_limit"),
              "XLA's spec xla/backends/gpu/target_config/specs/a100_sxm_40.txtpb"),)),
    GpuSpec("h100-pcie", "NVIDIA H100 PCIe", 84942979072, (9, 0), 114, 128, 233472, 232448, 2048,
            2039040000000, 52428800, 1.755, (),
            ((("memory_bytes, compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz, "
              "shared_memory_per_core, shared_memory_per_block_optin, threads_per_core_limit"),
              "XLA's spec xla/backends/gpu/target_config/specs/h100_pcie.txtpb"),)),
    GpuSpec("h100-nvl", "NVIDIA H100 NVL", 95830 * 2**20, (9, 0), 132, 128, 233472, 232448, 2048,
            3900000000000, 52428800, 1.785, (),
            (("memory_bytes", _SMI.format(95830)),
             ("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz",
              ("NVIDIA H100 datasheet (H100 NVL): 94 GB HBM3, 3.9 TB/s; the H100 SXM's 132 SMs and 50 MB L2 (Hopper "
              "whitepaper), boost 1,785 MHz; compute capability 9.0")),
             ("shared_memory_per_core, shared_memory_per_block_optin, threads_per_core_limit",
              f"{_GUIDE}: compute capability 9.0: 228 KB shared memory per SM, 227 KB per block, 2048 threads"))),
    GpuSpec("h20", "NVIDIA H20", 97871 * 2**20, (9, 0), 78, 128, 233472, 232448, 2048,
            4000000000000, 62914560, 1.98, (),
            (("memory_bytes", _SMI.format(97871) + " (96 GB HBM3, as the GH200's)"),
             ("compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz",
              ("NVIDIA H20 product brief (HGX H20): 96 GB HBM3, 4.0 TB/s, 60 MB L2, 78 SMs of a Hopper die; compute "
              "capability 9.0; the H100's 1,980 MHz boost (assumed)")),
             ("shared_memory_per_core, shared_memory_per_block_optin, threads_per_core_limit",
              f"{_GUIDE}: compute capability 9.0: 228 KB shared memory per SM, 227 KB per block, 2048 threads"))),
    GpuSpec("b300", "NVIDIA B300", 297021865984, (10, 3), 158, 128, 233472, 232448, 2048,
            7936000000000, 135528448, 1.965, (),
            ((("memory_bytes, compute_capability, core_count, memory_bandwidth, l2_cache_size, clock_rate_ghz, "
              "shared_memory_per_core, shared_memory_per_block_optin, threads_per_core_limit"),
              "XLA's spec xla/backends/gpu/target_config/specs/b300.txtpb"),)),
)


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
        *_MORE_CARDS,
    )
}


@dataclasses.dataclass(frozen=True)
class CloudHost:
    """A provider's 8-GPU machine type: a catalogue card in a host whose network (and memory) is not the
    card's reference system's. What users book; `--gpu a3-highgpu-8g` compiles for the card and times
    collectives across hosts at this host's NICs."""

    key: str
    card: str
    network_gbps: int         # the host's NICs for GPU traffic, Gb/s in all (shared by its 8 GPUs)
    nics: str                 # what they are
    memory: int               # the machine type's memory, bytes
    source: str
    aliases: tuple[str, ...] = ()
    gpus: int = 8             # the GPUs one machine holds: the most devices a host of the mesh can have

    @property
    def network_per_gpu(self) -> float:
        """Bytes/s per GPU, one way."""
        return self.network_gbps * 1e9 / 8 / self.gpus

    @property
    def host_memory(self) -> int:
        """Bytes per GPU."""
        return self.memory // self.gpus

    @property
    def link(self) -> str:
        return f"{self.nics}, {self.network_gbps:,} Gb/s per {self.gpus} GPUs"


_GCP = "Google Cloud, Compute Engine docs 'GPU machine types' and 'Networking and GPU machines': "
_AWS = "AWS EC2 accelerated computing instance types (P4/P5 pages): "
CLOUD_HOSTS = (
    CloudHost("a3-highgpu-8g", "h100", 800, "GPUDirect-TCPX, 4 x 200 Gb/s", 1872 * 10**9,
              _GCP + "a3-highgpu-8g (A3 High): 8 H100 80GB, 4 x 200 Gb/s NICs for GPU traffic (GPUDirect-TCPX), "
              "1,872 GB of memory", ("a3-high", "a3")),
    CloudHost("a3-megagpu-8g", "h100", 1600, "GPUDirect-TCPXO, 8 x 200 Gb/s", 1872 * 10**9,
              _GCP + "a3-megagpu-8g (A3 Mega): 8 H100 80GB, 8 x 200 Gb/s NICs for GPU traffic (GPUDirect-TCPXO), "
              "1,872 GB of memory", ("a3-mega",)),
    CloudHost("a3-ultragpu-8g", "h200", 3200, "RoCE, 8 x ConnectX-7 400 Gb/s", 2952 * 10**9,
              _GCP + "a3-ultragpu-8g (A3 Ultra): 8 H200 141GB, 8 x ConnectX-7 400 Gb/s (GPUDirect RDMA over RoCE), "
              "2,952 GB of memory", ("a3-ultra",)),
    CloudHost("p5.48xlarge", "h100", 3200, "EFA", 2048 * 2**30,
              _AWS + "p5.48xlarge: 8 H100 80GB, 3,200 Gb/s of EFA networking, 2,048 GiB of memory", ("p5",)),
    CloudHost("p5e.48xlarge", "h200", 3200, "EFA", 2048 * 2**30,
              _AWS + "p5e.48xlarge: 8 H200 141GB, 3,200 Gb/s of EFA networking, 2,048 GiB of memory", ("p5e",)),
    CloudHost("p4d.24xlarge", "a100-40g", 400, "EFA", 1152 * 2**30,
              _AWS + "p4d.24xlarge: 8 A100 40GB, 400 Gb/s of EFA networking, 1,152 GiB of memory", ("p4d",)),
    CloudHost("p4de.24xlarge", "a100-80g", 400, "EFA", 1152 * 2**30,
              _AWS + "p4de.24xlarge: 8 A100 80GB, 400 Gb/s of EFA networking, 1,152 GiB of memory", ("p4de",)),
)
_CARD_OF = {h.key: h.card for h in CLOUD_HOSTS}
_HOST_KEYS = frozenset(_CARD_OF)
_MACHINE_GPUS = {h.key: h.gpus for h in CLOUD_HOSTS}


def card_of(key: str) -> str:
    """The catalogue card a key names: a cloud machine type's card, else the key itself."""
    return _CARD_OF.get(key, key)


def machine_gpus(key: str) -> int | None:
    """The GPUs a cloud machine type holds (None for a card: its hosts are the user's to size)."""
    return _MACHINE_GPUS.get(key)


# a machine type is its card's spec under its own name (appended: a loop that matches a device's
# name finds the card first)
CATALOGUE.update({h.key: dataclasses.replace(CATALOGUE[h.card], key=h.key, aliases=h.aliases) for h in CLOUD_HOSTS})
_ALIASES = {a: s.key for s in CATALOGUE.values() for a in (s.key, *s.aliases)}


def _compact(name: str) -> str:
    """A spelling with case, spaces, dashes and the vendor/brand prefixes dropped: "NVIDIA GeForce RTX 4090"
    and "rtx-4090" are both "rtx4090"."""
    out = "".join(ch for ch in name.lower() if ch.isalnum())
    for prefix in ("nvidia", "geforce"):
        out = out.removeprefix(prefix)
    return out


# every alias, and each card's name as CUDA reports it, compacted
_COMPACT = {**{_compact(s.description): s.key for s in CATALOGUE.values() if s.key not in _HOST_KEYS},
            **{_compact(a): k for a, k in _ALIASES.items()}}
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
    # False where the driver has no GPU-to-GPU peer access (GeForce cards: RTX 3090/4090/5090): NCCL
    # then stages every transfer through host memory (its SHM transport), and intra_host_bandwidth
    # is costed as such (half the PCIe one-way rate: each byte crosses PCIe twice)
    peer_to_peer: bool = True


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


def _geforce(name: str, pcie: str, one_way: float, bridge: str = "") -> tuple[str, str]:
    return ("intra_host_bandwidth", (f"{name}: {pcie} x16, {one_way / 1e9:.0f} GB/s each way; NVIDIA's GeForce driver "
            f"has no PCIe peer-to-peer{bridge}, so NCCL stages transfers through host memory (SHM transport): each "
            f"byte crosses PCIe twice, costed at half the one-way rate ({one_way / 2e9:.0f} GB/s; an assumption)"))


_NO_NIC = ("inter_host_bandwidth", ("no NVIDIA reference system for these hosts: assumed one 200 Gb/s NIC per GPU, as "
           "in DGX A100 (25 GB/s each way)"))
_PCIE4, _PCIE5 = 32e9, 64e9   # PCIe 4.0 / 5.0 x16, bytes/s each way (64 / 128 GB/s bidirectional)
PERFORMANCE.update({
    "rtx-3090": Performance(
        71e12, 35.6e12, 35.6e12, 936e9, _PCIE4 / 2, 25e9, "PCIe 4.0 x16 (no P2P)", "200 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, int8_ops",
          ("NVIDIA Ampere GA102 whitepaper, Appendix A, GeForce RTX 3090: FP16/BF16 tensor with FP32 accumulate 71 "
           "TFLOPS (142 sparse), TF32 tensor 35.6 (71 sparse), FP32 35.6 TFLOPS, INT8 tensor 284 TOPS (568 sparse), "
           "936 GB/s GDDR6X; Ampere has no FP8")),
         _geforce("GeForce RTX 3090", "PCIe 4.0", _PCIE4, " (its NVLink bridge joins two cards only)"), _NO_NIC,
         ("host_bandwidth", "PCIe 4.0 x16: 32 GB/s each way")),
        host_bandwidth=_PCIE4, int8_ops=284e12, peer_to_peer=False),
    "rtx-4090": Performance(
        165.2e12, 82.6e12, 82.6e12, 1008e9, _PCIE4 / 2, 25e9, "PCIe 4.0 x16 (no P2P)", "200 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, fp8_flops, int8_ops",
          ("NVIDIA Ada GPU architecture whitepaper, Appendix A, GeForce RTX 4090: FP16/BF16 tensor with FP32 "
           "accumulate 165.2 TFLOPS (330.4 sparse), FP8 with FP32 accumulate 330.3 (660.6 sparse), TF32 tensor 82.6 "
           "(165.2 sparse), FP32 82.6 TFLOPS, INT8 660.6 TOPS (1,321.2 sparse), 1,008 GB/s GDDR6X")),
         _geforce("GeForce RTX 4090", "PCIe 4.0", _PCIE4, " and no NVLink"), _NO_NIC,
         ("host_bandwidth", "PCIe 4.0 x16: 32 GB/s each way")),
        host_bandwidth=_PCIE4, fp8_flops=330.3e12, int8_ops=660.6e12, peer_to_peer=False),
    "rtx-5090": Performance(
        209.5e12, 104.8e12, 104.8e12, 1792e9, _PCIE5 / 2, 25e9, "PCIe 5.0 x16 (no P2P)", "200 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, fp8_flops, int8_ops",
          ("NVIDIA RTX Blackwell GPU architecture whitepaper, GeForce RTX 5090: FP16/BF16 tensor with FP32 accumulate "
           "209.5 TFLOPS (419 sparse), FP8 with FP32 accumulate 419 (838 sparse), TF32 tensor 104.8 (209.5 sparse), "
           "FP32 104.8 TFLOPS, INT8 838 TOPS (1,676 sparse), 1,792 GB/s GDDR7")),
         _geforce("GeForce RTX 5090", "PCIe 5.0", _PCIE5, " and no NVLink"), _NO_NIC,
         ("host_bandwidth", "PCIe 5.0 x16: 64 GB/s each way")),
        host_bandwidth=_PCIE5, fp8_flops=419e12, int8_ops=838e12, peer_to_peer=False),
    "rtx-6000-ada": Performance(
        364.2e12, 182.1e12, 91.1e12, 960e9, _PCIE4, 25e9, "PCIe 4.0 x16 (P2P)", "200 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, fp8_flops, int8_ops",
          ("NVIDIA RTX 6000 Ada Generation datasheet: FP32 91.1 TFLOPS, tensor 1,457 TFLOPS (FP8 with sparsity: 728.5 "
           "dense); Ada whitepaper ratios for the professional AD102 (FP32 accumulate at full rate): BF16 364.2 dense, "
           "TF32 182.1 dense, INT8 728.5 TOPS dense; 960 GB/s GDDR6")),
         ("intra_host_bandwidth", ("NVIDIA RTX 6000 Ada datasheet: PCIe 4.0 x16 (32 GB/s each way), no NVLink; "
          "professional drivers support PCIe peer-to-peer")), _NO_NIC,
         ("host_bandwidth", "PCIe 4.0 x16: 32 GB/s each way")),
        host_bandwidth=_PCIE4, fp8_flops=728.5e12, int8_ops=728.5e12),
    "rtx-pro-6000": Performance(
        500e12, 250e12, 125e12, 1792e9, _PCIE5, 25e9, "PCIe 5.0 x16 (P2P)", "200 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, fp8_flops, int8_ops",
          ("NVIDIA RTX PRO 6000 Blackwell datasheet: FP32 125 TFLOPS, 4,000 AI TOPS (FP4 with sparsity), 1,792 GB/s "
           "GDDR7; dense rates from it by the Blackwell whitepaper's ratios (FP4 sparse = 2 x FP4 dense = 4 x FP8 "
           "dense = 8 x BF16 dense = 16 x TF32 dense): FP8 1,000, BF16 500, TF32 250 TFLOPS, INT8 1,000 TOPS")),
         ("intra_host_bandwidth", ("NVIDIA RTX PRO 6000 Blackwell datasheet: PCIe 5.0 x16 (64 GB/s each way), no "
          "NVLink; professional drivers support PCIe peer-to-peer")), _NO_NIC,
         ("host_bandwidth", "PCIe 5.0 x16: 64 GB/s each way")),
        host_bandwidth=_PCIE5, fp8_flops=1000e12, int8_ops=1000e12),
    "l40s": Performance(
        362.05e12, 183e12, 91.6e12, 864e9, _PCIE4, 25e9, "PCIe 4.0 x16 (P2P)", "200 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, fp8_flops, int8_ops",
          ("NVIDIA L40S datasheet: FP32 91.6 TFLOPS, TF32 tensor 183 (366 sparse), BF16 362.05 (733 sparse), FP8 733 "
           "(1,466 sparse) TFLOPS, INT8 733 TOPS (1,466 sparse), 864 GB/s GDDR6")),
         ("intra_host_bandwidth", "NVIDIA L40S datasheet: PCIe 4.0 x16 (32 GB/s each way), no NVLink"), _NO_NIC,
         ("host_bandwidth", "PCIe 4.0 x16: 32 GB/s each way")),
        host_bandwidth=_PCIE4, fp8_flops=733e12, int8_ops=733e12),
    "l4": Performance(
        121e12, 60e12, 30.3e12, 300e9, _PCIE4, 25e9, "PCIe 4.0 x16 (P2P)", "200 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, fp8_flops, int8_ops",
          ("NVIDIA L4 datasheet: FP32 30.3 TFLOPS, TF32 tensor 120 sparse (60 dense), BF16 242 sparse (121 dense), "
           "FP8 485 sparse (242.5 dense) TFLOPS, INT8 485 TOPS sparse (242.5 dense), 300 GB/s GDDR6")),
         ("intra_host_bandwidth", "NVIDIA L4 datasheet: PCIe 4.0 x16 (32 GB/s each way), no NVLink"), _NO_NIC,
         ("host_bandwidth", "PCIe 4.0 x16: 32 GB/s each way")),
        host_bandwidth=_PCIE4, fp8_flops=242.5e12, int8_ops=242.5e12),
    "a10g": Performance(
        125e12, 62.5e12, 31.2e12, 600e9, _PCIE4, 12.5e9 / 8, "PCIe 4.0 x16 (P2P)",
        "100 Gb/s per 8 GPUs (AWS g5.48xlarge)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, int8_ops",
          ("NVIDIA A10 datasheet (NVIDIA publishes none for AWS's A10G): BF16 tensor 125 TFLOPS (250 sparse), TF32 "
           "62.5 (125 sparse), FP32 31.2 TFLOPS, INT8 250 TOPS (500 sparse), 600 GB/s GDDR6; Ampere has no FP8")),
         ("intra_host_bandwidth", "AWS EC2 G5: A10G GPUs on PCIe 4.0 x16 (32 GB/s each way), no NVLink"),
         ("inter_host_bandwidth", ("AWS EC2 G5 page: g5.48xlarge, 8 GPUs and 100 Gb/s of networking (12.5 GB/s each "
          "way, shared evenly: 1.56 GB/s per GPU)")),
         ("host_bandwidth", "PCIe 4.0 x16: 32 GB/s each way")),
        host_bandwidth=_PCIE4, int8_ops=250e12),
    "a100-40g": Performance(
        312e12, 156e12, 19.5e12, 1.555e12, 300e9, 25e9, "NVLink 3", "HDR InfiniBand 200 Gb/s per GPU",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, intra_host_bandwidth",
          ("NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM: BF16 312 TFLOPS (624 sparse), TF32 156 (312 sparse), "
           "FP32 19.5 TFLOPS, 1,555 GB/s HBM2, NVLink 600 GB/s (bidirectional)")),
         ("inter_host_bandwidth", "NVIDIA DGX A100 user guide: 8 x ConnectX-6 200 Gb/s HDR InfiniBand, one per GPU"),
         ("host_bandwidth", "NVIDIA A100 datasheet: PCIe Gen4 64 GB/s (bidirectional), 32 GB/s each way"),
         ("int8_ops", "NVIDIA A100 datasheet: INT8 Tensor Core 624 TOPS dense (1,248 sparse); Ampere has no FP8")),
        host_bandwidth=_PCIE4, int8_ops=624e12),
    "h100-pcie": Performance(
        756.5e12, 378e12, 51.2e12, 2.0e12, _PCIE5, 50e9, "PCIe 5.0 x16 (P2P; NVLink bridge pairs)",
        "NDR InfiniBand 400 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, fp8_flops, int8_ops",
          ("NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: BF16 1,513 TFLOPS with sparsity (756.5 dense), TF32 756 "
           "(378 dense), FP32 51 TFLOPS, FP8 3,026 (1,513 dense), INT8 3,026 TOPS (1,513 dense), 2 TB/s HBM2e")),
         ("intra_host_bandwidth", ("NVIDIA H100 datasheet, H100 PCIe: PCIe Gen5 128 GB/s (64 GB/s each way); its "
          "NVLink bridge (600 GB/s) joins pairs only, so a host of 8 talks over PCIe")),
         ("inter_host_bandwidth", "assumed one ConnectX-7 400 Gb/s per GPU, as DGX H100 (50 GB/s each way)"),
         ("host_bandwidth", "PCIe Gen5 x16: 64 GB/s each way")),
        host_bandwidth=_PCIE5, fp8_flops=1513e12, int8_ops=1513e12),
    "h100-nvl": Performance(
        835.5e12, 417.5e12, 60e12, 3.9e12, _PCIE5, 50e9, "PCIe 5.0 x16 (P2P; NVLink bridge pairs)",
        "NDR InfiniBand 400 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, fp8_flops, int8_ops",
          ("NVIDIA H100 Tensor Core GPU datasheet, H100 NVL: BF16 1,671 TFLOPS with sparsity (835.5 dense), TF32 835 "
           "(417.5 dense), FP32 60 TFLOPS, FP8 3,341 (1,670.5 dense), INT8 3,341 TOPS (1,670.5 dense), 3.9 TB/s HBM3")),
         ("intra_host_bandwidth", ("NVIDIA H100 datasheet, H100 NVL: PCIe Gen5 128 GB/s (64 GB/s each way); its "
          "NVLink bridge (600 GB/s) joins pairs only, so a host of 8 talks over PCIe")),
         ("inter_host_bandwidth", "assumed one ConnectX-7 400 Gb/s per GPU, as DGX H100 (50 GB/s each way)"),
         ("host_bandwidth", "PCIe Gen5 x16: 64 GB/s each way")),
        host_bandwidth=_PCIE5, fp8_flops=1670.5e12, int8_ops=1670.5e12),
    "h20": Performance(
        148e12, 74e12, 44e12, 4.0e12, 450e9, 50e9, "NVLink 4", "NDR InfiniBand 400 Gb/s per GPU (assumed)",
        (("bf16_flops, tf32_flops, fp32_flops, hbm_bandwidth, intra_host_bandwidth, fp8_flops, int8_ops",
          ("NVIDIA HGX H20 product brief: BF16 148 TFLOPS, TF32 74, FP32 44 TFLOPS, FP8 296 TFLOPS, INT8 296 TOPS "
           "(dense), 4.0 TB/s HBM3, NVLink 900 GB/s (bidirectional, 450 each way)")),
         ("inter_host_bandwidth", "assumed one ConnectX-7 400 Gb/s per GPU, as DGX H100 (50 GB/s each way)"),
         ("host_bandwidth", "PCIe Gen5 x16: 64 GB/s each way")),
        host_bandwidth=_PCIE5, fp8_flops=296e12, int8_ops=296e12),
    "b300": Performance(
        2.25e15, 1.125e15, 75e12, 7.936e12, 900e9, 100e9, "NVLink 5", "ConnectX-8 800 Gb/s per GPU",
        (("bf16_flops, tf32_flops, fp32_flops, fp8_flops, intra_host_bandwidth",
          ("NVIDIA HGX B300 specifications, per GPU of 8: FP16/BF16 36 PFLOPS with sparsity per system (2.25 dense per "
           "GPU), TF32 18 (1.125 dense per GPU), FP8 72 (4.5 dense per GPU), FP32 600 TFLOPS (75 per GPU), NVLink 5 "
           "1.8 TB/s (bidirectional) per GPU")),
         ("hbm_bandwidth", "XLA's spec xla/backends/gpu/target_config/specs/b300.txtpb: 7.936 TB/s"),
         ("inter_host_bandwidth", "NVIDIA HGX B300: ConnectX-8 SuperNIC 800 Gb/s per GPU (100 GB/s each way)"),
         ("host_bandwidth", "PCIe Gen5 x16 assumed: 64 GB/s each way"),
         ("int8_ops", "Blackwell Ultra drops dense INT8 tensor throughput: not listed (None)")),
        host_bandwidth=_PCIE5, fp8_flops=4.5e15, host_memory=_DGX_RAM),
})

# a machine type's rates are its card's, with the host's network and memory
for _h in CLOUD_HOSTS:
    _p = PERFORMANCE[_h.card]
    PERFORMANCE[_h.key] = dataclasses.replace(
        _p, inter_host_bandwidth=_h.network_per_gpu, inter_host_link=_h.link, host_memory=_h.host_memory,
        sources=tuple(f for f in _p.sources if f[0] not in ("inter_host_bandwidth", "host_memory"))
        + (("inter_host_bandwidth, host_memory", _h.source),))

# Where the older catalogue entries' own figures come from (the new ones carry their GpuSpec.sources)
_SPEC_SOURCES = {
    "a100-80g": "XLA's spec xla/backends/gpu/target_config/specs/a100_sxm_80.txtpb",
    "h100": "XLA's spec xla/backends/gpu/target_config/specs/h100_sxm.txtpb",
    "h200": "XLA's spec xla/backends/gpu/target_config/specs/h200.txtpb",
    "b200": "XLA's spec xla/backends/gpu/target_config/specs/b200.txtpb",
    "gb200": "XLA's spec xla/backends/gpu/target_config/specs/gb200.txtpb",
    "rtx-a6000": "XLA's spec xla/backends/gpu/target_config/specs/a6000.txtpb",
    "gh200": ("the H100 die's XLA spec (h100_sxm.txtpb), NVIDIA's GH200 datasheet 4 TB/s, and nvidia-smi's 97,871 MiB "
              "total on GH200 machines"),
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

    def spec_sources(s: GpuSpec) -> list[dict]:
        pairs = s.sources or ((("memory_bytes, compute_capability, core_count, memory_bandwidth, l2_cache_size, "
                               "clock_rate_ghz"), _SPEC_SOURCES[card_of(s.key)]),)
        return [{"fields": f, "source": src} for f, src in pairs]

    return [{"name": s.key, "description": s.description, "memory_bytes": s.memory_bytes,
             "compute_capability": ".".join(map(str, s.compute_capability)), "aliases": list(s.aliases),
             "default": s.key == DEFAULT_GPU, "performance": perf(s.key),
             "memory_bandwidth": s.memory_bandwidth, "sm_count": s.core_count, "sources": spec_sources(s),
             **({"card": card_of(s.key), "gpus_per_machine": _MACHINE_GPUS[s.key]} if s.key in _HOST_KEYS else {}),
             } for s in CATALOGUE.values()]
