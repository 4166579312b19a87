"""The runtime's own memory: named, sized and sourced terms beside XLA's buffers.

XLA's buffer assignment covers the program's buffers. A real run also holds, per device
(docs/how-it-works.md §7, "Runtime memory outside XLA's buffers"):

* in JAX's pool: the allocator's rounding and fragmentation (``allocator``) -- added to the
  predicted peak (``runtime_overhead`` in the breakdown);
* outside the pool: the CUDA context and library handles (``cuda_context``), and one set
  of NCCL buffers per communicator (``nccl_communicators``): XLA creates one communicator
  per distinct device group its collectives use, so they are counted from the compiled
  program's replica groups and sized from NCCL's defaults for the topology (NVLS on
  H100/H200/B200 costs about twice as much);
* the cuBLAS workspace XLA hands each GEMM is an XLA buffer already (listed, 0 B here).

Every term says where its number comes from: "estimate (...)" until ``jaxmem calibrate``
has measured it on the card, then "measured ...". The verdict uses all of them: the pool
JAX takes (``total x fraction``) must hold the peak, and what stays outside it must hold
the out-of-pool terms (:func:`budget`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jaxmem.compiler import allocator as alloc_mod
from jaxmem.compiler import calibration, targets
from jaxmem.compiler.allocator import Allocator
from jaxmem.compiler.targets import CATALOGUE, GpuSpec, Target, card_of
from jaxmem.report import ReportWarning
from jaxmem.xla.collectives import collectives

if TYPE_CHECKING:
    from jaxmem.xla.hlo_text import Module

MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Term:
    name: str
    bytes: int          # per device
    in_pool: bool       # inside JAX's pool (adds to the peak) or outside it (bounds the pool)
    source: str         # "estimate (...)" or "measured ..."
    detail: str = ""    # what it is made of, briefly
    status: str = "estimate"   # "estimate" | "measured" | "xla" (already counted by XLA)
    # the range an estimate may take (None: exact, = bytes); the verdict is judged at both ends
    low_bytes: int | None = None
    high_bytes: int | None = None

    def __post_init__(self):
        for end in ("low_bytes", "high_bytes"):
            if getattr(self, end) is None:
                object.__setattr__(self, end, self.bytes)

    @property
    def estimated(self) -> bool:
        """A term whose range is wider than a point (what a verdict may hang on)."""
        assert self.low_bytes is not None and self.high_bytes is not None
        return self.high_bytes > self.low_bytes

    def at(self, end: str) -> int:
        """The term's bytes at one end of its range: "low", "estimate" or "high"."""
        v = {"low": self.low_bytes, "high": self.high_bytes}.get(end, self.bytes)
        assert v is not None
        return v

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Runtime:
    terms: tuple[Term, ...]
    communicators: int = 0                          # NCCL communicators of the busiest device
    groups: tuple[tuple[int, ...], ...] = ()        # the distinct device groups of the program's collectives
    nvls: bool = False
    calibrated: bool = False                        # from the user's `jaxmem calibrate`

    @property
    def in_pool_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if t.in_pool)

    @property
    def out_of_pool_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if not t.in_pool)

    def in_pool_at(self, end: str) -> int:
        return sum(t.at(end) for t in self.terms if t.in_pool)

    def out_of_pool_at(self, end: str) -> int:
        return sum(t.at(end) for t in self.terms if not t.in_pool)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Runtime:
        """The runtime a report saved (`compare --from`); terms saved before ranges are exact."""
        fields = {f.name for f in dataclasses.fields(Term)}
        terms = tuple(Term(**{k: v for k, v in t.items() if k in fields}) for t in d.get("terms", ()))
        nccl = d.get("nccl") or {}
        return cls(terms, int(nccl.get("communicators_per_device", 0)),
                   tuple(tuple(g) for g in nccl.get("groups", ())), bool(nccl.get("nvls", False)),
                   bool(d.get("calibrated", False)))

    def summary(self) -> str:
        """One line for runtime_overhead_source: the in-pool terms and what sits outside the pool."""
        def fmt(n):
            return f"{n / MiB:,.0f} MiB" if n >= MiB else f"{n:,} B"

        inside = "; ".join(f"{t.name} {fmt(t.bytes)}: {t.source}" for t in self.terms if t.in_pool)
        outside = ", ".join(f"{t.name} {fmt(t.bytes)}" for t in self.terms if not t.in_pool and t.bytes)
        return inside + (f"; outside the pool: {outside} (see runtime)" if outside else "")

    def to_json(self) -> dict:
        return {
            "in_pool_bytes": self.in_pool_bytes,
            "out_of_pool_bytes": self.out_of_pool_bytes,
            "terms": [t.to_json() for t in self.terms],
            "nccl": {"communicators_per_device": self.communicators, "groups": [list(g) for g in self.groups],
                     "nvls": self.nvls},
            "calibrated": self.calibrated,
        }


# ---------------------------------------------------------------- collectives of the compiled program

@dataclasses.dataclass(frozen=True)
class Collectives:
    groups: tuple[frozenset[int], ...]     # distinct groups of 2+ devices
    all_to_all: frozenset[frozenset[int]] = frozenset()   # the groups an all-to-all runs over (peers connected)


def collective_groups(program: str | Module, mesh_axes) -> Collectives:
    """The distinct device groups (2+ devices) the program's collectives run over; `program`:
    the optimized HLO, as text or parsed.

    XLA:GPU keys its NCCL communicators by the devices taking part (one communicator per
    distinct group since per-stream communicators went off by default, openxla/xla#10965).
    A collective-permute's communicator spans every device of the program (XLA builds its
    clique from the empty replica groups), unless every device only sends to itself.
    """

    n = 1
    for _, size in mesh_axes:
        n *= int(size)
    everyone = frozenset(range(n))
    seen: set[frozenset[int]] = set()
    a2a: set[frozenset[int]] = set()
    for c in collectives(program, mesh_axes):
        if c.kind in ("all-to-all", "ragged-all-to-all"):
            a2a.update(frozenset(g) for g in c.replica_groups if len(set(g)) >= 2)
        if c.kind in ("collective-permute", "collective-broadcast") and all(len(set(p)) == 1 or len(p) < 2
                                                                           for p in c.replica_groups):
            continue
        if c.kind == "collective-permute":
            seen.add(everyone)
            continue
        seen.update(frozenset(g) for g in c.replica_groups if len(set(g)) >= 2)
    return Collectives(tuple(sorted(seen, key=lambda s: (len(s), sorted(s)))), frozenset(a2a))


# ---------------------------------------------------------------- the model


def spec_for(target: Target) -> GpuSpec | None:
    """The catalogue spec of a target (a deviceless one, or a local GPU the catalogue knows)."""
    if target.gpu in CATALOGUE:
        return CATALOGUE[target.gpu]
    kind = target.description.strip().lower()
    for spec in CATALOGUE.values():
        desc = spec.description.lower()
        if kind == desc or desc.startswith(kind) or kind.startswith(desc):
            return spec
    return None


def _sm_threads(target: Target, spec: GpuSpec | None) -> tuple[int, int] | None:
    if spec is not None:
        return spec.core_count, spec.threads_per_core_limit
    dev = target.devices[0] if target.devices else None
    cores = getattr(dev, "core_count", None)
    cc = str(getattr(dev, "compute_capability", "") or "")
    if not cores:
        return None
    # max resident threads per SM: 1536 on sm_86/sm_89, 2048 on sm_80/sm_90/sm_100
    return int(cores), 1536 if cc in ("8.6", "8.7", "8.9") else 2048


def context_estimate(target: Target, est: dict) -> tuple[int, str]:
    spec = spec_for(target)
    sm = _sm_threads(target, spec)
    fixed = est["context_heap_bytes"] + est["context_printf_fifo_bytes"] + est["context_fixed_bytes"]
    if sm is None:
        return fixed, "SM count unknown: the per-thread stack is left out"
    cores, threads = sm
    stack = est["context_stack_bytes_per_thread"] * threads * cores
    return stack + fixed, f"{cores} SMs x {threads} threads of stack"


from jaxmem.compiler.nccl import (  # noqa: E402, F401  (NCCL's settings live jax-free, re-exported here)
    CUMEM_GRANULARITY,
    NCCL_CHANNELS_NET,
    NCCL_CHANNELS_NVLINK,
    NCCL_LL128_BUFFSIZE,
    NCCL_LL_BUFFSIZE,
    NCCL_MAXCHANNELS,
    NCCL_NVLS_CHANNELS,
    NCCL_NVLS_CHUNKSIZE,
    NCCL_SIMPLE_BUFFSIZE,
    NCCL_STEPS,
    NcclCommunicator,
    NcclSettings,
    _fabric_of,
    _round,
    all_to_all_peers,
    nccl_communicator,
)


def nccl_term(target: Target, groups, n: int, hosts: int, env: Mapping[str, str], spec: GpuSpec | None,
              est: dict, a2a=frozenset()) -> tuple[Term, bool, int]:
    """The busiest device's NCCL communicators as one term (low..high), whether NVLS is in it, and how
    many communicators that device holds."""

    s = NcclSettings.from_env(env)
    perf = targets.performance(target.gpu)
    domain = perf.nvlink_domain if perf is not None else None
    nvls_card = spec is not None and card_of(spec.key) in est["nvls_gpus"]
    cc = spec.compute_capability[0] if spec is not None else 9
    per_device = [[0, 0, 0] for _ in range(n)]
    count = [0] * n
    kinds: dict[str, int] = {}
    used_nvls = False
    for g in groups:
        places = [_fabric_of(d, n, hosts, domain) for d in g]
        span = len({h for h, _ in places})
        fabrics: dict[int, int] = {}
        for _, f in places:
            fabrics[f] = fabrics.get(f, 0) + 1
        local = max(fabrics.values())
        c = nccl_communicator(len(g), local, span, nvls_card=nvls_card, cc_major=cc, s=s)
        if frozenset(g) in a2a:   # every peer connected, when the first all-to-all runs: the high end only
            lo_p, hi_p = all_to_all_peers(len(g), s)
            c = dataclasses.replace(c, high=c.high + hi_p, parts=c.parts + f" + all-to-all {len(g) - 1} peers up to "
                                    f"{hi_p / MiB:,.0f} MiB ({lo_p / MiB:,.0f} at the fewest channels)")
        used_nvls |= "NVLS" in c.parts
        key = (f"{len(g)} GPUs" + (f" over {span} hosts" if span > 1 else "") + f": {c.low / MiB:,.0f}-"
               f"{c.high / MiB:,.0f} MiB, estimate {c.bytes / MiB:,.0f} MiB ({c.parts})")
        for d in g:
            if d < n:
                per_device[d][0] += c.low
                per_device[d][1] += c.bytes
                per_device[d][2] += c.high
                count[d] += 1
        kinds[key] = kinds.get(key, 0) + 1
    busiest = max(range(n), key=lambda d: per_device[d][1]) if n else 0
    low, mid, high = per_device[busiest]
    k = count[busiest]
    detail = (f"{k} communicator(s) on the busiest device ({len(groups)} device group(s) in the program's "
              f"collectives); per communicator: " + "; ".join(f"{m} x {key}" if m > 1 else key
                                                             for key, m in kinds.items()))
    if nvls_card:
        detail += "; NVLS on (NCCL_NVLS_ENABLE=0 turns it off)" if s.nvls else "; NVLS off"
    if s.set_by_env:
        detail += f"; from the environment: {', '.join(s.set_by_env)}"
    source = ("estimate (NCCL's allocations from its source, NVIDIA/nccl 2.30 src/init.cc, src/transport/p2p.cc, "
              "net.cc, nvls.cc: LL 512 KiB + LL128 4.7 MiB + Simple NCCL_BUFFSIZE 4 MiB per channel and peer, NVLS "
              "16 channels x 2 x 1 MiB per head; channel counts from NCCL_DEBUG=INFO logs, NVIDIA/nccl#892, #1781, "
              "#1189; low: the ring alone, as NCCL_RUNTIME_CONNECT=1 connects the rest on first use; high: ring, "
              "tree and NVLS all connected, and an all-to-all's every peer at up to 32 channels (#1685), each "
              "buffer rounded to the 2 MiB cuMem granularity; `jaxmem calibrate` on the cluster measures it)")
    return Term("nccl_communicators", mid, False, source, detail, "estimate", low, high), used_nvls, k



def model(target: Target, program: str | Module | None = None, mesh_axes=None, *, hosts: int | None = None,
          env: Mapping[str, str] | None = None) -> Runtime:
    """The runtime terms of one compiled program on `target` (per device); `program`: its
    optimized HLO, as text or parsed (None: no collectives counted); `mesh_axes`: the mesh the
    program was compiled for, ``(name, size)`` pairs in mesh order; `env`: where the NCCL_*
    variables are read (default: this process's environment)."""
    env = os.environ if env is None else env
    mesh_axes = tuple(mesh_axes) if mesh_axes else (("data", len(target.devices)),)
    n = 1
    for _, size in mesh_axes:
        n *= int(size)
    hosts = hosts if hosts is not None else target.hosts
    kind = "cpu" if target.platform == "cpu" else target.description
    entry, calibrated = calibration.lookup(kind, target.platform)
    if target.platform == "cpu":
        assert entry is not None, "the shipped calibration has an entry for 'cpu'"
        per_process = entry.per_process_bytes // max(n, 1)
        return Runtime((Term("host_runtime", entry.in_pool_bytes + per_process, True, entry.source,
                             f"{entry.per_process_bytes:,} B per process shared by {n} host device(s)"
                             if entry.per_process_bytes else "", "measured"),), calibrated=calibrated)

    est = calibration.shipped_raw()["cuda_estimates"]
    terms = []
    if entry is not None:
        when = f" {entry.measured_at}" if entry.measured_at else ""
        terms.append(Term("allocator", entry.in_pool_bytes, True, entry.source,
                          f"allocator rounding and runtime buffers in the pool, measured{when}", "measured"))
        terms.append(Term("cuda_context", entry.out_of_pool_bytes, False, entry.source,
                          f"CUDA context + cuBLAS/cuDNN handles, measured{when}", "measured"))
    else:
        terms.append(Term("allocator", est["allocator_in_pool_bytes"], True, est["allocator_source"],
                          "allocator rounding and fragmentation", "estimate", est["allocator_in_pool_low_bytes"],
                          est["allocator_in_pool_high_bytes"]))
        ctx, how = context_estimate(target, est)
        fixed = est["context_fixed_bytes"]
        terms.append(Term("cuda_context", ctx, False, est["context_source"],
                          f"CUDA context + cuBLAS/cuDNN handles; {how}", "estimate",
                          ctx - fixed + est["context_fixed_low_bytes"], ctx - fixed + est["context_fixed_high_bytes"]))

    colls = collective_groups(program, mesh_axes) if n > 1 and program else Collectives(())
    spec = spec_for(target)
    k, used_nvls = 0, False
    if colls.groups and entry is not None and entry.nccl_communicator_bytes is not None:   # measured on the card
        count = [sum(d in g for g in colls.groups) for d in range(n)]
        k = max(count)
        terms.append(Term("nccl_communicators", k * entry.nccl_communicator_bytes, False, entry.source,
                          f"{k} communicator(s) on the busiest device ({len(colls.groups)} device group(s) in the "
                          f"program's collectives), {entry.nccl_communicator_bytes / MiB:,.0f} MiB each as measured",
                          "measured"))
    elif colls.groups:
        term, used_nvls, k = nccl_term(target, colls.groups, n, hosts, env, spec, est, colls.all_to_all)
        terms.append(term)
    else:
        terms.append(Term("nccl_communicators", 0, False, "the compiled program", "no collectives between devices"
                          if n > 1 else "one device: no collectives", "xla"))
    terms.append(Term("cublas_workspace", 0, True, "XLA's buffer assignment (gemm_rewriter)",
                      "already an XLA buffer in activations_and_temporaries (32 MiB on Hopper and newer, "
                      "4 MiB before): not counted again", "xla"))
    return Runtime(tuple(terms), k, tuple(tuple(sorted(g)) for g in colls.groups), used_nvls, calibrated)


# ---------------------------------------------------------------- what JAX's pool may use


@dataclasses.dataclass(frozen=True)
class Budget:
    usable_bytes: int | None        # what the peak must fit in
    note: str
    out_of_pool_room: int | None    # what the pool leaves on the card for the out-of-pool terms
    out_of_pool_fits: bool = True
    # how the pool is sized, for judging at each end of the runtime's ranges (judge): "prealloc" (BFC, total x
    # fraction reserved at start), "grow" (BFC, the same cap, on demand), "platform" (on demand from the whole
    # card), "async" / "async_grow" (cuda_async: total x fraction is a release threshold, not a cap; reserved at
    # start or not), "fixed" (an attached GPU's bytes_limit); None on CPU (jaxmem.compiler.allocator)
    mode: str | None = None
    total_bytes: int | None = None
    fraction: float | None = None
    allocator: Allocator | None = None


def budget(target: Target, mem_fraction: float | None, rt: Runtime, *, allocator: str | None = None,
           env: Mapping[str, str] | None = None) -> Budget:
    """How JAX sizes its pool under the allocator the run uses (jaxmem.compiler.allocator: --allocator and
    --mem-fraction, else the environment's XLA_PYTHON_CLIENT_* variables, else JAX's preallocated BFC at
    0.75), and whether the runtime's out-of-pool terms fit beside it."""

    total = target.memory_bytes
    if total is None:
        return Budget(None, "CPU: no fixed device memory; the OS decides", None)
    if target.gpu.startswith("local:"):
        return Budget(total, "the allocator's bytes_limit on this GPU", None, mode="fixed", total_bytes=total)
    a = alloc_mod.read(os.environ if env is None else env, allocator, mem_fraction)
    usable, room, fits = pool_budget(total, a.fraction, rt.out_of_pool_bytes, mode=a.mode)
    return Budget(usable, a.note, room, fits, a.mode, total, a.fraction, a)


def pool_budget(total: int, frac: float, oop: int, *, prealloc: bool = True, platform: bool = False,
                mode: str | None = None) -> tuple[int, int, bool]:
    """(usable bytes, the room the pool leaves on the card, whether the out-of-pool terms fit in it)
    for a card of `total` bytes, JAX's memory fraction `frac` and `oop` bytes of runtime memory
    outside the pool; `mode` (Budget.mode) over `prealloc` / `platform`. `compare --from` re-judges
    saved rows with it. Under cuda_async the usable bytes are the release threshold: what a step can
    hold without memory going back to the driver between steps."""
    mode = mode or ("platform" if platform else "prealloc" if prealloc else "grow")
    if mode == "platform":   # on-demand allocation from the whole card
        return total - oop, total - oop, oop <= total
    pool = int(total * frac)
    if mode in ("prealloc", "async"):
        # The pool is reserved at start-up; the context and NCCL's buffers must fit in what is left.
        return pool, total - pool, oop <= total - pool
    # Grown on demand up to the same cap (threshold): the runtime's memory and the pool share the card.
    usable = min(pool, total - oop)
    return usable, total - usable, oop <= total


# ---------------------------------------------------------------- the verdict, with the runtime's ranges

ENDS = ("low", "estimate", "high")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """fits / tight / does_not_fit. XLA's buffers are exact; the runtime's estimated terms have a
    range: "fits" holds at the high end of every range, "does_not_fit" fails even at the low end,
    "tight" is the answer that depends on where an estimated term lands (`terms` names them)."""

    verdict: str | None            # None: no fixed memory (CPU)
    margin_bytes: int | None       # bytes to spare in the tighter constraint at the estimates (< 0: short by)
    margins: dict[str, int]        # the same margin at each end: low / estimate / high
    side: str = ""                 # the constraint that decides: "pool" (the peak) or "outside" (the out-of-pool terms)
    terms: tuple[dict, ...] = ()   # tight: {name, low_bytes, bytes, high_bytes} of the terms it hangs on

    @property
    def fits(self) -> bool | None:
        return None if self.verdict is None else self.verdict != "does_not_fit"

    def does_not_fit(self) -> Verdict:
        """The same margins, judged over by a constraint outside them (pinned host memory)."""
        return dataclasses.replace(self, verdict="does_not_fit", terms=())


ASYNC_MODES, ABOVE_THRESHOLD = alloc_mod.ASYNC_MODES, alloc_mod.ABOVE_THRESHOLD


def _margins(bud: Budget, xla_peak: int, rt: Runtime, end: str) -> tuple[int, int]:
    """(pool margin, out-of-pool margin) with every runtime term at `end`; an unconstrained side is huge.
    Under cuda_async the pool margin is the release threshold's and the other what the card has left once
    the pool (the threshold reserved, or the peak where it is higher) and the out-of-pool terms are resident."""
    assert bud.total_bytes is not None and bud.usable_bytes is not None
    total = bud.total_bytes
    peak = xla_peak + rt.in_pool_at(end)
    oop = rt.out_of_pool_at(end)
    free = 1 << 62
    if bud.mode == "fixed":
        return bud.usable_bytes - peak, free
    if bud.mode == "platform":
        return total - oop - peak, free
    assert bud.fraction is not None
    pool = int(total * bud.fraction)
    if bud.mode in ASYNC_MODES:
        return pool - peak, total - (max(pool, peak) if bud.mode == "async" else peak) - oop
    if bud.mode == "grow":   # the pool grows on demand up to its cap; the runtime takes its share first
        return min(pool, total - oop) - peak, total - oop
    return pool - peak, (total - pool) - oop


def judge(bud: Budget, xla_peak: int, rt: Runtime) -> Verdict:
    """The verdict for XLA's `xla_peak` (its lower bound, without the runtime's in-pool terms) in the
    budget `bud`, judged with the runtime's terms at the low end, the estimate and the high end.
    Under cuda_async a peak above the release threshold is never "fits": "tight" where the card holds
    it beside the out-of-pool terms (it runs, and fails intermittently), else "does_not_fit"."""
    if bud.usable_bytes is None or bud.total_bytes is None:
        return Verdict(None, None, {})
    at = {end: _margins(bud, xla_peak, rt, end) for end in ENDS}
    margins = {end: min(m) for end, m in at.items()}
    pool_m, out_m = at["estimate"]
    side = "pool" if pool_m <= out_m else "outside"
    if bud.mode in ASYNC_MODES and at["high"][0] < 0 and at["low"][1] >= 0:
        above = {"name": ABOVE_THRESHOLD, "low_bytes": int(bud.total_bytes * (bud.fraction or 0)),
                 "bytes": xla_peak + rt.in_pool_at("estimate"), "high_bytes": xla_peak + rt.in_pool_at("high")}
        hangs = tuple({"name": t.name, "low_bytes": t.low_bytes, "bytes": t.bytes, "high_bytes": t.high_bytes}
                      for t in rt.terms if t.estimated and not t.in_pool) if at["high"][1] < 0 else ()
        return Verdict("tight", margins["estimate"], margins, "pool", (above, *hangs))
    if margins["high"] >= 0:
        return Verdict("fits", margins["estimate"], margins, side)
    if margins["low"] < 0:
        return Verdict("does_not_fit", margins["estimate"], margins, side)
    # tight: the side(s) that fail at the high end, and the estimated terms on them
    sides = {s for s, m in zip(("pool", "outside"), at["high"], strict=True) if m < 0}
    cands = [t for t in rt.terms if t.estimated and ("pool" if t.in_pool else "outside") in sides]
    # the terms that alone, at their high end (the others low), would make it not fit; else all of them
    alone = [t for t in cands if min(_margins(bud, xla_peak, _only_high(rt, t), "low")) < 0]
    hangs_on = sorted(alone or cands, key=lambda t: -(t.at("high") - t.at("low")))
    side = "pool" if "pool" in sides and "outside" not in sides else "outside" if "pool" not in sides else side
    return Verdict("tight", margins["estimate"], margins, side,
                   tuple({"name": t.name, "low_bytes": t.low_bytes, "bytes": t.bytes, "high_bytes": t.high_bytes}
                         for t in hangs_on))


def band(bud: Budget, xla_peak: int, rt: Runtime) -> tuple[float | None, float | None]:
    """The memory fractions the step fits at, (floor, ceiling): floor = what the pool must hold (XLA's peak and
    the in-pool terms at their high end) over the card, rounded up; ceiling = what the card leaves once the
    memory outside the pool is resident at its high end, over the card, rounded down (4 decimals). floor >
    ceiling: no fraction fits. (None, None) where no fraction applies (CPU, an attached GPU's fixed limit)."""
    total = bud.total_bytes
    if total is None or bud.mode in (None, "fixed"):
        return None, None
    need = xla_peak + rt.in_pool_at("high")
    leaves = max(total - rt.out_of_pool_at("high"), 0)
    return math.ceil(need * 10_000 / total) / 10_000, math.floor(leaves * 10_000 / total) / 10_000


def band_of_report(r) -> tuple[float | None, float | None]:
    """band() of a saved Report (its peak, runtime terms and card): rows re-judged without a compile."""
    t = r.target
    if t.memory_bytes is None or t.gpu.startswith("local:"):
        return None, None
    rt = Runtime.from_json(r.runtime or {})
    bud = Budget(t.usable_bytes, t.usable_note, None, mode="prealloc", total_bytes=t.memory_bytes)
    return band(bud, r.per_device_peak_bytes - rt.in_pool_bytes, rt)


def _only_high(rt: Runtime, term: Term) -> Runtime:
    """`rt` with `term` pinned at its high end (judged at the others' low end)."""
    pinned = tuple(dataclasses.replace(t, low_bytes=t.high_bytes) if t is term else t for t in rt.terms)
    return dataclasses.replace(rt, terms=pinned)


def _fraction_at_most(total: int, oop: int) -> float:
    """The largest memory fraction (2 decimals, rounded down) that leaves `oop` bytes of the card."""
    return math.floor((total - oop) / total * 100) / 100


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def verdict_warnings(target: Target, rt: Runtime, bud: Budget, v: Verdict) -> list:
    """The warnings a verdict's margins call for (kinds "runtime_out_of_pool", "verdict_tight" and
    "allocator_above_threshold").

    runtime_out_of_pool: the out-of-pool terms do not fit beside a preallocated pool even at the low
    end. verdict_tight: the answer hangs on estimated terms; names them and their ranges. A memory
    fraction the fix names is one that leaves room for the high end: never the value given."""

    out = []
    above = next((t for t in v.terms if t["name"] == ABOVE_THRESHOLD), None)
    if above is not None and bud.total_bytes is not None:   # cuda_async: runs, fails intermittently
        fractions = band(bud, above["high_bytes"] - rt.in_pool_at("high"), rt)
        outside = (rt.out_of_pool_at("low"), rt.out_of_pool_at("high"))
        out += alloc_mod.above_threshold(above, bud.note, bud.total_bytes, outside, fractions)
    if bud.mode in ("prealloc", "async") and bud.total_bytes and bud.fraction is not None and v.verdict is not None:
        total, pool = bud.total_bytes, int(bud.total_bytes * bud.fraction)
        room = total - pool
        lo, hi = rt.out_of_pool_at("low"), rt.out_of_pool_at("high")
        frac = _fraction_at_most(total, hi)
        fix = (f"use a memory fraction of at most {frac:.2f} (room for the high end, {_gib(hi)})" if frac > 0
               else "the card cannot hold the runtime's high end beside any pool")
        nvls = "; or NCCL_NVLS_ENABLE=0 (NCCL's NVLS buffers off)" if rt.nvls else ""
        if lo > room:
            out.append(ReportWarning(
                "runtime_out_of_pool", f"the runtime needs {_gib(lo)}-{_gib(hi)} per device outside JAX's pool "
                f"(CUDA context, {rt.communicators} NCCL communicator(s); estimate {_gib(rt.out_of_pool_bytes)}) but "
                f"the pool leaves {_gib(room)} of the card ({bud.note}): even the low end does not fit and NCCL fails "
                f"to initialize; {fix}{nvls}", lo - room))
        elif v.verdict == "tight" and v.side == "outside":
            named = ", ".join(f"{t['name']} {_gib(t['low_bytes'])}-{_gib(t['high_bytes'])} (estimate "
                              f"{_gib(t['bytes'])})" for t in v.terms)
            out.append(ReportWarning(
                "verdict_tight", f"TIGHT: the pool leaves {_gib(room)} of the card ({bud.note}) for the runtime's "
                f"memory outside it, {_gib(lo)}-{_gib(hi)}; the answer hangs on {named}. It fits at the low end, not "
                f"at the high end: {fix}{nvls}", hi - room))
    if v.verdict == "tight" and v.side == "pool" and bud.mode not in ASYNC_MODES:
        named = ", ".join(f"{t['name']} {_gib(t['low_bytes'])}-{_gib(t['high_bytes'])}" for t in v.terms)
        short = -v.margins["high"]
        out.append(ReportWarning(
            "verdict_tight", f"TIGHT: the peak fits the pool with the runtime's in-pool terms at their low end, not at "
                             f"their high end; the answer hangs on {named}: {_gib(short)} less peak (the hints "
                             "above) makes it fit at every end", short))
    return out
