"""What kernels of each class achieve on a card, from public measurements (each constant with its
source), and the time a kernel, a collective and the step as XLA scheduled it take at those rates."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from jaxmem.compiler import targets
from jaxmem.xla import hlo_text
from jaxmem.xla.collectives import Collective

# kind -> (Performance field, label); a card without the field runs those dots at the bf16 rate.
_PEAKS = {
    "bf16": ("bf16_flops", "bf16 dense tensor"),
    "fp16": ("bf16_flops", "fp16 dense tensor"),
    "tf32": ("tf32_flops", "tf32 dense tensor: fp32 dots at JAX's default precision"),
    "fp32": ("fp32_flops", "fp32 CUDA cores: fp32 dots at precision highest"),
    "fp8": ("fp8_flops", "fp8 dense tensor"),
    "int8": ("int8_ops", "int8 dense tensor"),
    "other": ("fp32_flops", "fp32 CUDA-core rate: f64/integer dots, no tensor-core peak in the catalogue"),
    "non-dot": ("fp32_flops", "fp32 CUDA cores: element-wise and reductions"),
}


def _wire_factor(c: Collective) -> float:
    n = c.group_size
    if n <= 1:
        return 0.0
    if c.kind == "all-reduce":
        return 2.0 * (n - 1) / n
    if c.kind in ("collective-permute", "collective-broadcast"):
        return 1.0
    return (n - 1) / n


def _link(c: Collective, devices_per_host: int, perf) -> tuple[str, float]:
    """The link a collective's groups cross and the bandwidth each member sees on it.

    Within a host, or an NVLink domain that spans hosts (GB200 NVL72, DGX GH200): NVLink (PCIe).
    Across hosts, NCCL runs one ring per network rail, and each
    GPU of a host has its own NIC, so a group with k members per host moves its data through k
    NICs at once: k x the per-GPU network bandwidth, but never more than the host's own links.
    """
    crossing, k = False, 1
    for g in c.replica_groups:
        per_host: dict[int, int] = {}
        for d in g:
            per_host[d // devices_per_host] = per_host.get(d // devices_per_host, 0) + 1
        if len(per_host) > 1:
            crossing = True
            k = max(k, min(per_host.values()))
    if not crossing:
        return perf.intra_host_link, perf.intra_host_bandwidth
    return "network", min(perf.intra_host_bandwidth, k * perf.inter_host_bandwidth)


# -- achieved rates: what kernels of each class reach, from public measurements ---------------------
#
# Each constant is (low, central, high) with its source; the estimate uses the central value, the
# band (low_s / high_s) the two ends. None is fitted to the published step times that judge the
# estimate (benchmarks/steptime_accuracy.py).

@dataclasses.dataclass(frozen=True)
class Rate:
    low: float
    central: float
    high: float
    source: str


# cuBLAS(Lt) GEMMs in training: the Maximum *Sustainable* Matmul FLOPS (MSMF) of mamf-finder.py, as a share
# of the datasheet peak, by architecture (compute capability major). A training step is one long saturated
# run: the board sits at its power limit and the SM clock settles below boost, so the short-burst ceiling
# (MAMF, ~80% on Hopper) overstates what back-to-back GEMMs hold (stas00/ml-engineering
# compute/accelerator/benchmarks/README.md, "MAMF & MSMF": MSMF "matches real training throughput").
_MSMF = ("stas00/ml-engineering compute/accelerator/benchmarks/README.md (mamf-finder.py MSMF, every GPU of the "
         "node busy)")
GEMM_FRACTION: dict[int, Rate] = {
    # no MSMF published for Ampere: its MAMF (A100 SXM 271.2 / 312, torch 2.6; A100 PCIe 252.9) at the clock
    # an A100 sustains at its power limit, 1305 of its 1410 MHz boost (NVIDIA's HPL Rpeak convention,
    # glennklockwood.com/garden/peak-FLOPS); the fast end is the burst MAMF itself
    8: Rate(252.9 / 312 * 1305 / 1410, 271.2 / 312 * 1305 / 1410, 271.2 / 312,
            "stas00/ml-engineering compute/accelerator/README.md MAMF table (BF16): A100 SXM 271.2, A100 PCIe 252.9 "
            "of 312 TFLOPS, at the 1305 of 1410 MHz an A100 sustains at its power limit (glennklockwood.com/garden/"
            "peak-FLOPS: NVIDIA's HPL Rpeak clock)"),
    # 8 x H200 (H100's compute die and 700 W): node MSMF 727 TFLOPS (the slowest GPU, which synchronous
    # training runs at; median GPU 752); all 8 busy, 5 rounds: 698.6 (n=40). Of the 989.4 TFLOPS peak.
    9: Rate(698.6 / 989.4, 727 / 989.4, 752 / 989.4,
            _MSMF + ": 8 x H200 BF16, node MSMF 727 TFLOPS (median GPU 752); all 8 busy x 5 rounds 698.6 (n=40), "
                    "of 989.4"),
    # 8 x B200, all busy x 5 rounds: 1426.4 TFLOPS (n=40); GPU0 alone 1455.7. Of the 2250 TFLOPS peak.
    10: Rate(1426.4 / 2250, 1426.4 / 2250, 1455.7 / 2250,
             _MSMF + ": 8 x B200 BF16, all 8 busy x 5 rounds 1426.4 TFLOPS (n=40), GPU0 alone 1455.7, of 2250"),
}
# FP8 GEMMs: no MSMF published; the FP8 MAMF (H100 SXM 1402.6, H200 1453.4 of 1979 TFLOPS; B200 3432.5 of
# 4500) scaled by the same architecture's BF16 sustained / burst ratio (Hopper: 727 / 794.5 MAMF;
# Blackwell: 1426.4 / 1745.0), the power limit binding FP8 as it does BF16. Ampere has no FP8 tensor cores.
_HOPPER_SUSTAINED = (698.6 / 794.5, 727 / 794.5, 752 / 794.5)
FP8_GEMM_FRACTION: dict[int, Rate] = {
    9: Rate(1402.6 / 1979 * _HOPPER_SUSTAINED[0], 1402.6 / 1979 * _HOPPER_SUSTAINED[1],
            1453.4 / 1979 * _HOPPER_SUSTAINED[2],
            "stas00/ml-engineering compute/accelerator/README.md MAMF table (FP8 e4m3): H100 SXM 1402.6, H200 1453.4 "
            "of 1979 TFLOPS, x Hopper's BF16 MSMF / MAMF (727 or 698.6-752 / 794.5)"),
    10: Rate(3432.5 / 4500 * 1426.4 / 1745.0, 3432.5 / 4500 * 1426.4 / 1745.0, 3432.5 / 4500 * 1455.7 / 1745.0,
             "stas00/ml-engineering compute/accelerator/README.md MAMF table (FP8 e4m3): B200 3432.5 of 4500 TFLOPS, "
             "x Blackwell's BF16 MSMF / MAMF (1426.4-1455.7 / 1745.0)"),
}
# cuDNN fused (flash) attention on H100 SXM5, BF16, head dim 128, sequence 2k-16k: FlashAttention-3
# (Shah et al. 2024, arXiv:2407.08608), figures "Attention forward/backward speed, head dim 128 (H100 80GB
# SXM5)", cuDNN bars: forward 595-617 TFLOPS, backward 465-518 TFLOPS (FLOPs counted as here: causal
# masks halve them). As a share of the 989 TFLOPS peak, and applied to other cards' bf16 peak.
ATTENTION_FWD_FRACTION = Rate(595 / 989.4, 605 / 989.4, 617 / 989.4,
                              "FlashAttention-3 (arXiv:2407.08608) forward, head dim 128, H100 SXM5: cuDNN "
                              "595-617 TFLOPS at 2k-16k tokens")
ATTENTION_BWD_FRACTION = Rate(465 / 989.4, 505 / 989.4, 518 / 989.4,
                              "FlashAttention-3 (arXiv:2407.08608) backward, head dim 128, H100 SXM5: cuDNN "
                              "465-518 TFLOPS at 2k-16k tokens")
# memory-bound kernels: a STREAM-like copy / triad reaches ~85-92% of the datasheet HBM bandwidth
HBM_FRACTION = Rate(0.85, 0.88, 0.92, "NVIDIA/cccl PR #9881, cub::DeviceTransform babelstream benchmarks: 87-88% "
                                      "of peak memory bandwidth at 2^24-2^28 elements; STREAM-like GPU copies "
                                      "generally 85-92%")
# the shortest a kernel takes: launch and tail. A kernel of 2.9 us ran back to back at 3.4-3.8 us per
# kernel (NVIDIA developer blog "Getting Started with CUDA Graphs", 2019: with and without graphs)
LAUNCH_FLOOR_S = Rate(2.0e-6, 3.0e-6, 3.8e-6, "NVIDIA developer blog 'Getting Started with CUDA Graphs' "
                                             "(2019): 3.4-3.8 us per short kernel launched back to back")
# NCCL's bus bandwidth as a share of the one-way link rate: NVLink 4 reaches ~370 of 450 GB/s
# (protocol overhead ~20%: ring all-gather / reduce-scatter, NCCL_ALGO=RING all-reduce); NVLink SHARP
# (NVLS) all-reduce on 8 H100 ~480 GB/s bus bandwidth. InfiniBand NDR 400 Gb/s: 46-48 GB/s per NIC.
NVLINK_FRACTION = Rate(0.78, 0.82, 0.84, "NVIDIA/nccl-tests issue #212 (NCCL maintainer): 450 GB/s line rate, "
                                         "~370 GB/s effective NVLink bus bandwidth with NCCL's protocol overhead")
NVLS_ALLREDUCE_FRACTION = Rate(0.98, 1.05, 1.067, "NVIDIA/nccl-tests issues #212 and #290: NVLS all-reduce peak "
                                                  "bus bandwidth ~476-480 GB/s on 8 H100 (of 450 GB/s one way)")
NETWORK_FRACTION = Rate(0.92, 0.94, 0.96, "NVIDIA/nccl-tests issue #290 (NVIDIA): 46-48 GB/s per NDR 400 Gb/s NIC")
# a collective's fixed cost (ring set-up, synchronisation): small-message rows of nccl-tests, e.g. a
# 2 MiB all-reduce between two H100 hosts takes 93-113 us at 18-22 GB/s (NVIDIA/nccl-tests issue #232)
COLLECTIVE_LATENCY_S = {"intra": Rate(8e-6, 12e-6, 20e-6, "nccl-tests small-message latency within an NVLink host"),
                        "network": Rate(20e-6, 30e-6, 50e-6, "NVIDIA/nccl-tests issue #232: 2 MiB all-reduce "
                                                             "across two hosts 93-113 us")}
# a ring collective's latency grows with its ring: NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc,
# ncclTopoTuneModel) charges a base latency plus one hardware latency per ring step (n-1 steps for all-gather /
# reduce-scatter, 2(n-1) for all-reduce), the steps between hosts at the network's: Ring/Simple hwLat across
# NCCL versions NVLink 3.4-5.7 us, network 6.6-14 us per step, baseLat 8.4 us
RING_BASE_LATENCY_S = 8.4e-6
RING_STEP_LATENCY_S = {"intra": Rate(3.4e-6, 3.4e-6, 5.7e-6, "NVIDIA/nccl src/graph/tuning.cc hwLat, NVLink Ring/"
                                                              "Simple: 3.4-5.7 us per step across versions (baseLat "
                                                              "8.4 us)"),
                       "network": Rate(6.6e-6, 9.6e-6, 14e-6, "NVIDIA/nccl src/graph/tuning.cc hwLat, NET Ring/Simple: "
                                                               "6.6-14 us per step across versions")}
# compute beside communication: an NCCL kernel holds SMs (one thread block per channel) and HBM bandwidth
# while it runs, so the kernels XLA overlaps with a collective run slower than alone. Measured on H100 /
# A100 / MI250 / MI210 with GPT and LLaMA layers: 18.9% slower on average, at most 40.0% (Characterizing
# Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning, arXiv:2507.03114, 2025);
# the fast end of the band assumes none (the paper's "ideal" baseline).
OVERLAP_SLOWDOWN = Rate(0.0, 0.189, 0.40, "arXiv:2507.03114 (2025), compute beside overlapped communication on "
                                          "H100/A100/MI250/MI210, GPT and LLaMA layers: 18.9% slower on average, "
                                          "40.0% at most")
# wave quantization: a GEMM's output is cut into tiles, one per SM at a time; the last wave runs partly
# empty (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background": tile and wave
# quantization). cuBLAS's large-GEMM tiles on Hopper/Ampere: 128 x 256 (the guide's example size).
GEMM_TILE = (128, 256)

RATE_SOURCES = {
    "gemm": "GEMM_FRACTION / FP8_GEMM_FRACTION (sustained matmul rate by architecture: " + _MSMF + ") x wave "
            "quantization (NVIDIA Deep Learning Performance Guide)",
    "attention": ATTENTION_FWD_FRACTION.source + "; " + ATTENTION_BWD_FRACTION.source,
    "memory": HBM_FRACTION.source,
    "launch": LAUNCH_FLOOR_S.source,
    "nvlink": NVLINK_FRACTION.source,
    "nvls": NVLS_ALLREDUCE_FRACTION.source,
    "network": NETWORK_FRACTION.source,
    "latency": COLLECTIVE_LATENCY_S["network"].source,
    "overlap": OVERLAP_SLOWDOWN.source,
    "ring_latency": RING_STEP_LATENCY_S["intra"].source + "; " + RING_STEP_LATENCY_S["network"].source,
}
# NVLink SHARP needs an NVSwitch with multicast (Hopper and later, 4+ GPUs): these catalogue cards
_NVLS_CARDS = frozenset({"h100", "h200", "b200", "gh200", "gb200"})


def _pick(r: Rate, end: str) -> float:
    return {"low": r.low, "central": r.central, "high": r.high}[end]


@dataclasses.dataclass(frozen=True)
class Rates:
    """The achieved rates of one card at one end of the band ("fast": every rate at its high end,
    "central", "slow": every rate at its low end)."""

    gemm_fraction: float
    fp8_gemm_fraction: float
    attn_fwd: float         # FLOP/s
    attn_bwd: float
    hbm: float              # bytes/s
    launch_s: float
    nvlink_fraction: float
    nvls_fraction: float
    network_fraction: float
    latency_intra_s: float
    latency_network_s: float
    sm_count: int
    nvls: bool
    overlap_slowdown: float = 0.0   # share by which a kernel slows while a collective runs beside it
    ring_step_intra_s: float = 3.4e-6
    ring_step_network_s: float = 9.6e-6


def rates(gpu: str, perf, end: str = "central") -> Rates:
    """The achieved rates of catalogue card `gpu` (`end`: fast, central or slow)."""

    spec = targets.CATALOGUE.get(gpu)
    major = spec.compute_capability[0] if spec is not None else 9
    fast = {"fast": "high", "central": "central", "slow": "low"}[end]
    slow = {"fast": "low", "central": "central", "slow": "high"}[end]   # for times: fast = the short end
    gemm = GEMM_FRACTION.get(major, GEMM_FRACTION[9])
    # Ada (8.9) has FP8 tensor cores but no FP8 MAMF published: Hopper's share
    fp8 = FP8_GEMM_FRACTION.get(major, FP8_GEMM_FRACTION[9])
    return Rates(
        gemm_fraction=_pick(gemm, fast),
        fp8_gemm_fraction=_pick(fp8, fast),
        attn_fwd=_pick(ATTENTION_FWD_FRACTION, fast) * perf.bf16_flops,
        attn_bwd=_pick(ATTENTION_BWD_FRACTION, fast) * perf.bf16_flops,
        hbm=_pick(HBM_FRACTION, fast) * perf.hbm_bandwidth,
        launch_s=_pick(LAUNCH_FLOOR_S, slow),
        nvlink_fraction=_pick(NVLINK_FRACTION, fast),
        nvls_fraction=_pick(NVLS_ALLREDUCE_FRACTION, fast),
        network_fraction=_pick(NETWORK_FRACTION, fast),
        latency_intra_s=_pick(COLLECTIVE_LATENCY_S["intra"], slow),
        latency_network_s=_pick(COLLECTIVE_LATENCY_S["network"], slow),
        sm_count=spec.core_count if spec is not None else 132,
        nvls=targets.card_of(gpu) in _NVLS_CARDS,
        overlap_slowdown=_pick(OVERLAP_SLOWDOWN, slow),
        ring_step_intra_s=_pick(RING_STEP_LATENCY_S["intra"], slow),
        ring_step_network_s=_pick(RING_STEP_LATENCY_S["network"], slow),
    )


def wave_efficiency(dims: tuple[int, int, int, int] | None, sm_count: int) -> float:
    """The share of SM time a GEMM's tiles fill: tiles / (waves x SMs) (1.0 when its shape is unknown)."""
    if not dims:
        return 1.0
    batch, m, n, _ = dims
    tm, tn = GEMM_TILE
    tiles = max(batch, 1) * -(-max(m, 1) // tm) * -(-max(n, 1) // tn)
    waves = -(-tiles // sm_count)
    return tiles / (waves * sm_count)


def kernel_time(k, perf, r: Rates) -> float:
    """Seconds one run of kernel `k` (kernels.Kernel, not a collective) takes: the longer of its math at
    its class's achieved rate and its bytes at the achieved HBM bandwidth, never below the launch floor."""
    memory = k.bytes / r.hbm
    if k.klass == "gemm":
        kind, passes = k.dot_kind or ("bf16", 1)
        field, _ = _PEAKS[kind]
        peak = getattr(perf, field) or perf.bf16_flops
        share = r.fp8_gemm_fraction if kind == "fp8" else r.gemm_fraction
        rate = peak * share * wave_efficiency(k.gemm_dims, r.sm_count)
        if kind in ("fp32", "other"):
            rate = peak   # CUDA-core math: the datasheet rate (no MAMF measured for it)
        math_s = k.flops * passes / rate
    elif k.klass == "attention":
        math_s = k.flops / (r.attn_bwd if k.backward else r.attn_fwd)
    else:
        math_s = 0.0
    return max(math_s, memory, r.launch_s)


def collective_time(c: Collective, perf, r: Rates, devices_per_host: int, nvls: bool) -> tuple[float, str]:
    """Seconds one execution of collective `c` takes, and the link it crosses: latency + ring wire
    bytes over NCCL's bus bandwidth on that link (NVLS for an all-reduce inside an NVSwitch host)."""
    if c.group_size <= 1:
        return 0.0, "none"
    link, bw = _link(c, devices_per_host, perf)
    wire = _wire_factor(c) * c.bytes
    if link == "network":
        busbw = bw * r.network_fraction
        latency = ring_latency(c, devices_per_host, r)
    elif nvls and c.kind == "all-reduce" and c.group_size >= 4:
        busbw, latency, link = bw * r.nvls_fraction, r.latency_intra_s, link + " (NVLS)"
    else:
        busbw, latency = bw * r.nvlink_fraction, ring_latency(c, devices_per_host, r)
    return latency + wire / busbw, link


def ring_latency(c: Collective, devices_per_host: int, r: Rates) -> float:
    """NCCL's ring latency for collective `c` (RING_STEP_LATENCY_S): base + a hop latency per ring step, the
    steps between hosts at the network's; a collective-permute is one step."""
    n = c.group_size
    hosts = max((len({d // devices_per_host for d in g}) for g in c.replica_groups), default=1)
    if c.kind in ("collective-permute", "collective-broadcast"):
        steps, inter = 1, int(hosts > 1)
    elif c.kind == "all-reduce":
        steps, inter = 2 * (n - 1), 2 * (hosts - 1)
    else:
        steps, inter = n - 1, hosts - 1
    inter = min(inter, steps)
    return RING_BASE_LATENCY_S + (steps - inter) * r.ring_step_intra_s + inter * r.ring_step_network_s


def communication_rows(colls: list[Collective], perf, r: Rates, devices_per_host: int) -> list[dict]:
    """One row per (kind, mesh axes, link) with its count, bytes, wire bytes and busy time per step, at
    NCCL's measured bus bandwidths (:func:`collective_time`), longest first."""
    rows: dict[tuple, dict] = {}
    for c in colls:
        t, link = collective_time(c, perf, r, devices_per_host, r.nvls)
        key = (c.kind, c.axes, link)
        row = rows.setdefault(key, {"kind": c.kind, "axes": list(c.axes), "link": link, "count": 0, "bytes": 0,
                                    "wire_bytes": 0.0, "time_s": 0.0})
        row["count"] += c.count_in_loop
        row["bytes"] += c.bytes_per_step
        row["wire_bytes"] += _wire_factor(c) * c.bytes_per_step
        row["time_s"] += t * c.count_in_loop
    for row in rows.values():
        row["wire_bytes"] = int(row["wire_bytes"])
    return sorted(rows.values(), key=lambda r: -r["time_s"])


_START_DONE = {"all-gather-done", "all-reduce-done", "reduce-scatter-done", "collective-permute-done", "async-done",
               "fusion-done", "copy-done", "send-done", "recv-done", "all-to-all-done", "ragged-all-to-all-done",
               "collective-broadcast-done"}


# kernels XLA launches asynchronously on a stream of their own (a ``fusion-start`` is waited for at its
# ``fusion-done``): they hide behind the compute XLA scheduled between the two, as collectives do
_ASYNC_KERNELS = frozenset({"fusion-start", "async-start"})


def simulate(module: hlo_text.Module, ks: list, colls: list[Collective], perf, r: Rates,
             devices_per_host: int) -> dict[str, Any]:
    """The step's time with overlap as XLA scheduled it.

    Each computation runs its instructions in the printed (scheduled) order on two streams: kernels on
    the compute stream, collectives on the communication stream. An async collective starts when its
    ``*-start`` is reached (and the communication stream is free) and is waited for at its ``*-done``:
    it hides behind exactly the compute XLA placed between the two. A synchronous collective waits for
    both streams. An async fusion (``fusion-start`` ... ``fusion-done``) runs on a third stream the same way.
    A kernel that runs while a collective is in flight is slowed by ``r.overlap_slowdown``. A ``while`` runs its
    body trip-count times; a conditional its longest branch.
    """
    sim = _Schedule(module, ks, colls, perf, r, devices_per_host)
    step, slowdown = sim.run(module.entry)
    busy: dict[str, float] = defaultdict(float)     # class -> seconds its kernels run per step
    for k in ks:
        if k.klass != "collective":
            busy[k.klass] += sim.kt(k) * k.runs
    for c in colls:
        busy["collective"] += collective_time(c, perf, r, devices_per_host, r.nvls)[0] * c.count_in_loop
    return {"step_s": step, "busy": dict(busy), "overlap_slowdown_s": slowdown}


class _Stream:
    """One run of a computation: the compute, communication and async-fusion streams' clocks."""

    def __init__(self) -> None:
        self.tc = self.tm = self.ta = 0.0
        self.extra = 0.0            # seconds the compute stream lost to collectives running beside it
        self.ends: dict[str, float] = {}

    def compute(self, t: float, slow: float) -> None:
        """A kernel of `t` seconds on the compute stream; the part overlapping a collective in flight runs
        `slow` times longer (SMs and HBM shared)."""
        window = self.tm - self.tc
        if window > 0 and slow > 1.0:
            d = t * slow if t * slow <= window else window + (t - window / slow)
            self.extra += d - t
            t = d
        self.tc += t

    def end(self) -> float:
        return max(self.tc, self.tm, self.ta, *self.ends.values())


class _Schedule:
    """simulate's state: kernel times and each computation's (time, overlap slowdown), memoized."""

    def __init__(self, module: hlo_text.Module, ks: list, colls: list[Collective], perf, r: Rates,
                 devices_per_host: int):
        self.module, self.perf, self.r, self.dph = module, perf, r, devices_per_host
        self.by_kernel = {(k.computation, k.name): k for k in ks}
        self.coll_by = {(c.computation, c.name): c for c in colls}
        self.times: dict[tuple[str, str], float] = {}
        self.memo: dict[str, tuple[float, float]] = {}
        self.slow = 1.0 + r.overlap_slowdown

    def kt(self, k) -> float:
        key = (k.computation, k.name)
        if key not in self.times:
            self.times[key] = kernel_time(k, self.perf, self.r)
        return self.times[key]

    def run(self, cname: str) -> tuple[float, float]:
        """(seconds one run of computation `cname` takes, of which the overlap slowdown)."""
        if cname in self.memo:
            return self.memo[cname]
        comp = self.module.computations.get(cname)
        if comp is None:
            return 0.0, 0.0
        s = _Stream()
        for ins in comp.instructions:
            key = (cname, ins.name)
            if key in self.coll_by:
                t, _ = collective_time(self.coll_by[key], self.perf, self.r, self.dph, self.r.nvls)
                if ins.opcode.endswith("-start") or ins.opcode == "async-start":
                    s.tm = max(s.tc, s.tm) + t
                    s.ends[ins.name] = s.tm
                else:
                    s.tc = s.tm = max(s.tc, s.tm) + t
            elif ins.opcode in _START_DONE:
                ops = ins.operand_names
                if ops and ops[0] in s.ends:
                    s.tc = max(s.tc, s.ends.pop(ops[0]))
            elif ins.opcode in ("while", "conditional", "call"):
                t, extra = self._control(ins)
                s.tc += t
                s.extra += extra
            elif (k := self.by_kernel.get(key)) is not None and k.klass != "collective":
                if ins.opcode in _ASYNC_KERNELS:
                    # an async fusion (XLA's async dynamic-slice / dynamic-update-slice fusions of loop-
                    # carried stacks) runs on a stream of its own from its start, waited for at its done
                    s.ta = max(s.ta, s.tc) + self.kt(k)
                    s.ends[ins.name] = s.ta
                else:
                    s.compute(self.kt(k), self.slow)
        self.memo[cname] = (s.end(), s.extra)
        return self.memo[cname]

    def _control(self, ins) -> tuple[float, float]:
        """(seconds, overlap slowdown) of a while (its body x trip count; a known trip count runs no
        condition on XLA:GPU), a conditional (its longest branch) or a call."""
        comps = self.module.computations
        if ins.opcode == "while":
            called = dict(ins.called)
            known = self.module.trip_counts.get(ins.name)
            trips = known or 1
            body, cond = called.get("body"), None if known else called.get("condition")
            b = self.run(body) if body else (0.0, 0.0)
            c = self.run(cond) if cond else (0.0, 0.0)
            return trips * b[0] + (trips + 1) * c[0], trips * b[1] + (trips + 1) * c[1]
        branches = [c for a, c in ins.called if c in comps and (a != "to_apply" or ins.opcode == "call")]
        return max((self.run(b) for b in branches), key=lambda x: x[0]) if branches else (0.0, 0.0)
