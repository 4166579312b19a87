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
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from jaxmem.compiler import calibration
from jaxmem.compiler.targets import CATALOGUE, GpuSpec, Target
from jaxmem.report import ReportWarning

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


def collective_groups(program: str | Module, mesh_axes) -> Collectives:
    """The distinct device groups (2+ devices) the program's collectives run over; `program`:
    the optimized HLO, as text or parsed.

    XLA:GPU keys its NCCL communicators by the devices taking part (one communicator per
    distinct group since per-stream communicators went off by default, openxla/xla#10965).
    A collective-permute's communicator spans every device of the program (XLA builds its
    clique from the empty replica groups), unless every device only sends to itself.
    """
    from jaxmem.xla.collectives import collectives

    n = 1
    for _, size in mesh_axes:
        n *= int(size)
    everyone = frozenset(range(n))
    seen: set[frozenset[int]] = set()
    for c in collectives(program, mesh_axes):
        if c.kind in ("collective-permute", "collective-broadcast") and all(len(set(p)) == 1 or len(p) < 2
                                                                           for p in c.replica_groups):
            continue
        if c.kind == "collective-permute":
            seen.add(everyone)
            continue
        seen.update(frozenset(g) for g in c.replica_groups if len(set(g)) >= 2)
    return Collectives(tuple(sorted(seen, key=lambda s: (len(s), sorted(s)))))


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


def _hosts_of(group: frozenset[int], n_devices: int, hosts: int) -> int:
    per_host = max(n_devices // max(hosts, 1), 1)
    return len({d // per_host for d in group})


def model(target: Target, program: str | Module | None = None, mesh_axes=None, *, hosts: int | None = None,
          env: Mapping[str, str] | None = None) -> Runtime:
    """The runtime terms of one compiled program on `target` (per device); `program`: its
    optimized HLO, as text or parsed (None: no collectives counted); `mesh_axes`: the mesh the
    program was compiled for, ``(name, size)`` pairs in mesh order."""
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
                          "allocator rounding and fragmentation"))
        ctx, how = context_estimate(target, est)
        terms.append(Term("cuda_context", ctx, False, est["context_source"],
                          f"CUDA context + cuBLAS/cuDNN handles; {how}"))

    colls = collective_groups(program, mesh_axes) if n > 1 and program else Collectives(())
    spec = spec_for(target)
    nvls_card = spec is not None and spec.key in est["nvls_gpus"]
    nvls_on = nvls_card and str(env.get("NCCL_NVLS_ENABLE", "1")).strip() != "0"
    per_device = [0] * n
    count = [0] * n
    used_nvls = used_plain = False
    for g in colls.groups:
        nvls = nvls_on and _hosts_of(g, n, hosts) < len(g)  # 2+ devices of the group share an NVSwitch host
        if entry is not None and entry.nccl_communicator_bytes is not None:
            size = entry.nccl_communicator_bytes
        elif nvls:
            size = est["nccl_nvls_communicator_bytes"]
        else:
            size = est["nccl_communicator_two_ranks_bytes"] if len(g) == 2 else est["nccl_communicator_bytes"]
        used_nvls |= nvls
        used_plain |= not nvls
        for d in g:
            if d < n:
                per_device[d] += size
                count[d] += 1
    busiest = max(range(n), key=lambda d: per_device[d]) if n else 0
    comm_bytes = per_device[busiest] if n else 0
    k = count[busiest] if n else 0
    measured = entry is not None and entry.nccl_communicator_bytes is not None
    if entry is not None and entry.nccl_communicator_bytes is not None:  # measured
        src = entry.source
    else:  # the sources of the sizes used: NVLS groups, groups without NVLS (one device per host), or both
        src = "; ".join(est[k] for k, used in (("nccl_nvls_source", used_nvls), ("nccl_source", used_plain)) if used)
    detail = (f"{k} communicator(s) on the busiest device ({len(colls.groups)} device group(s) in the "
              f"program's collectives)")
    if nvls_card and k:
        detail += ("; NVLS on: about twice the buffers (NCCL_NVLS_ENABLE=0 turns it off)" if nvls_on
                   else "; NVLS off (NCCL_NVLS_ENABLE=0)")
    if hosts > 1 and any(_hosts_of(g, n, hosts) > 1 for g in colls.groups):
        detail += "; groups span hosts: NCCL's network buffers are not modelled"
    if k:
        terms.append(Term("nccl_communicators", comm_bytes, False, src, detail, "measured" if measured else "estimate"))
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


def budget(target: Target, mem_fraction: float | None, rt: Runtime) -> Budget:
    """How JAX sizes its pool (XLA's GPU client: pool = total x fraction, preallocated by
    default), and whether the runtime's out-of-pool terms fit beside it."""
    from jaxmem.compiler import targets
    from jaxmem.errors import UserError

    total = target.memory_bytes
    if total is None:
        return Budget(None, "CPU: no fixed device memory; the OS decides", None)
    if target.gpu.startswith("local:"):
        return Budget(total, "the allocator's bytes_limit on this GPU", None)
    oop = rt.out_of_pool_bytes
    alloc = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower()
    if alloc == "platform":
        usable, room, fits = pool_budget(total, 1.0, oop, platform=True)
        return Budget(usable, "XLA_PYTHON_CLIENT_ALLOCATOR=platform: on-demand allocation from the whole card, "
                      "less the runtime's memory outside the pool", room, fits)
    if mem_fraction is not None:
        if not 0 < mem_fraction <= 1:
            raise UserError(f"--mem-fraction {mem_fraction}: must be in (0, 1]")
        frac, note = mem_fraction, f"--mem-fraction {mem_fraction}"
    else:
        frac, note = targets.usable_fraction()
    prealloc = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in ("false", "0")
    usable, room, fits = pool_budget(total, frac, oop, prealloc=prealloc)
    return Budget(usable, note, room, fits)


def pool_budget(total: int, frac: float, oop: int, *, prealloc: bool = True,
                platform: bool = False) -> tuple[int, int, bool]:
    """(usable bytes, the room the pool leaves on the card, whether the out-of-pool terms fit in it)
    for a card of `total` bytes, JAX's memory fraction `frac` and `oop` bytes of runtime memory
    outside the pool. `compare --from` re-judges saved rows with it."""
    if platform:   # on-demand allocation from the whole card
        return total - oop, total - oop, oop <= total
    pool = int(total * frac)
    if prealloc:
        # The pool is reserved at start-up; the context and NCCL's buffers must fit in what is left.
        return pool, total - pool, oop <= total - pool
    # Grown on demand up to the same cap: the runtime's memory and the pool share the card.
    usable = min(pool, total - oop)
    return usable, total - usable, oop <= total


def check_out_of_pool(target: Target, rt: Runtime, bud: Budget) -> list[ReportWarning]:
    """runtime_out_of_pool: the CUDA context and NCCL's communicators do not fit beside JAX's pool."""
    if bud.out_of_pool_fits:
        return []
    assert target.memory_bytes is not None and bud.out_of_pool_room is not None   # a GPU's pool: both known
    return [ReportWarning(
        "runtime_out_of_pool", f"the runtime needs {rt.out_of_pool_bytes / 2**30:.2f} GiB per device outside JAX's "
        f"pool (CUDA context, {rt.communicators} NCCL communicator(s)) but the pool leaves "
        f"{bud.out_of_pool_room / 2**30:.2f} GiB of the card ({bud.note}): NCCL fails to initialize; use a "
        f"memory fraction of at most "
        f"{max(target.memory_bytes - rt.out_of_pool_bytes, 0) / target.memory_bytes:.2f}",
        rt.out_of_pool_bytes - bud.out_of_pool_room)]
