"""The allocator a run will use, read as JAX reads it, and what a memory fraction means under it.

jaxlib reads its GPU client's memory settings from the environment when it starts (jaxlib/xla_client.py,
generate_pjrt_gpu_plugin_options): XLA_PYTHON_CLIENT_ALLOCATOR ("default", "bfc", "platform",
"cuda_async"; "default" is BFC), XLA_CLIENT_MEM_FRACTION (or the deprecated
XLA_PYTHON_CLIENT_MEM_FRACTION; default 0.75) and XLA_PYTHON_CLIENT_PREALLOCATE (default true). What XLA
does with them (openxla/xla, xla/pjrt/gpu/gpu_helpers.cc and se_gpu_pjrt_client.cc; the JAX docs' "GPU
memory allocation" page):

* BFC (the default): ``CreateBFCAllocator`` gives a ``tsl::BFCAllocator`` total x fraction bytes;
  preallocated (``allow_growth = !preallocate``) it reserves them when JAX starts, so a peak above them fails
  at once and the runtime's memory outside the pool (CUDA context, NCCL) must fit in what the pool leaves.
  Grown on demand (PREALLOCATE=false) it keeps the same cap, takes memory as the step needs it, and can also
  fail below the cap from fragmentation ("more prone to GPU memory fragmentation", the JAX docs).
* platform: cudaMalloc/cudaFree per buffer from the whole card; the fraction is not read.
* cuda_async: ``GpuCudaMallocAsyncAllocator`` (xla/stream_executor/gpu/gpu_cudamallocasync_allocator.cc)
  sets the device pool's CU_MEMPOOL_ATTR_RELEASE_THRESHOLD to total x fraction and allocates with
  cuMemAllocFromPoolAsync, which does not check a limit (the fraction is only the stats' bytes_limit): a
  peak above the fraction runs; what the pool holds above the threshold goes back to the driver at each
  synchronization and is mapped again by the next step. That fails intermittently when, at that moment,
  the memory outside the pool and the temporaries cannot both be resident (public JAX runs on GB200 saw
  one failure in about 380 steps). Preallocated, it allocates and frees the threshold at start (reserved).

jax-free: the CLI checks these before jax starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from jaxmem.errors import UserError
from jaxmem.report import ReportWarning

KINDS = ("bfc", "platform", "cuda_async")   # --allocator's choices (jaxlib's names; "default" is bfc)
ENV = "XLA_PYTHON_CLIENT_ALLOCATOR"
DEFAULT_FRACTION = 0.75                     # jaxlib's default memory fraction
FRACTION_NAMES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")   # the newer name first
PLATFORM_NOTE = "on-demand allocation from the whole card"
ASYNC_MODES = ("async", "async_grow")       # runtime.Budget.mode under cuda_async (reserved at start, or not)
# The tight verdict's term under cuda_async when the peak passes the release threshold (low_bytes: the threshold,
# bytes / high_bytes: the peak at the estimate / at the high end of the in-pool terms)
ABOVE_THRESHOLD = "peak above cuda_async's release threshold"


@dataclasses.dataclass(frozen=True)
class Allocator:
    """The allocator settings of a run: kind, preallocation and the memory fraction, with what set them."""

    kind: str                   # "bfc" | "platform" | "cuda_async"
    preallocate: bool
    fraction: float             # total x fraction is BFC's cap or cuda_async's release threshold (1.0: platform)
    note: str                   # what sized the pool, as TargetInfo.usable_note says it
    kind_source: str            # "user" (--allocator, XLA_PYTHON_CLIENT_ALLOCATOR) | "default" (JAX's)
    fraction_source: str        # "user" (--mem-fraction, XLA_*_MEM_FRACTION) | "default" (JAX's 0.75)
    kind_from: str = ""         # the flag or variable that set the kind ("" for JAX's default)

    @property
    def mode(self) -> str:
        """runtime.Budget.mode: prealloc | grow (BFC), platform, async | async_grow (cuda_async)."""
        if self.kind == "platform":
            return "platform"
        if self.kind == "cuda_async":
            return "async" if self.preallocate else "async_grow"
        return "prealloc" if self.preallocate else "grow"

    @property
    def why(self) -> str:
        """Choices.allocator_why: what set it and what can fail under it."""
        who = self.kind_from or f"JAX's default ({ENV} unset)"
        if self.kind == "platform":
            return (f"{who}: cudaMalloc/cudaFree per buffer from the whole card (the memory fraction is not read): no "
                    "pool to overflow, the slowest mode; fails when the peak and the memory outside the pool exceed "
                    "the card")
        if self.kind == "cuda_async":
            held = ("reserved at start (XLA_PYTHON_CLIENT_PREALLOCATE)" if self.preallocate else
                    "not reserved (XLA_PYTHON_CLIENT_PREALLOCATE=false)")
            return (f"{who}: CUDA's stream-ordered pool (cudaMallocAsync); the memory fraction is the pool's release "
                    f"threshold, {held}, not a cap: a peak above it runs, the memory above the threshold returned to "
                    "the driver at each synchronization and mapped again by the next step, which fails "
                    "intermittently when the memory outside the pool and the temporaries cannot both be resident")
        if self.preallocate:
            return (f"{who}: XLA's BFC allocator, its pool (total x memory fraction) reserved when JAX starts: a "
                    "step whose peak is above the pool fails at once; the memory outside the pool (CUDA context, "
                    "NCCL) must fit in what the pool leaves of the card")
        return (f"{who}: XLA's BFC allocator grown on demand up to total x memory fraction "
                "(XLA_PYTHON_CLIENT_PREALLOCATE=false): a peak above the cap fails at once, and near it a step can "
                "also fail from fragmentation (free memory split in blocks too small), which a preallocated pool "
                "avoids")


def _preallocate(env: Mapping[str, str]) -> bool:
    # jaxlib: preallocate unless the variable is false/0 (read case-insensitively here, as jaxmem always has)
    return str(env.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")).lower() not in ("false", "0")


def env_fraction(env: Mapping[str, str]) -> tuple[float, str] | None:
    """The memory fraction the environment sets and the variable that set it ("NAME=value"); None: unset.
    jaxlib reads XLA_CLIENT_MEM_FRACTION, and the deprecated XLA_PYTHON_CLIENT_MEM_FRACTION as a fallback."""
    name = FRACTION_NAMES[0] if env.get(FRACTION_NAMES[0]) else FRACTION_NAMES[1]
    raw = env.get(name)
    if not raw:
        return None
    try:
        frac = float(raw)
    except ValueError:
        raise UserError(f"{name}={raw!r} is not a number") from None
    if not (math.isfinite(frac) and 0 < frac <= 1):
        raise UserError(f"{name}={raw}: JAX's memory fraction must be in (0, 1]; unset it or give e.g. 0.9")
    return frac, f"{name}={raw}"


def env_kind(env: Mapping[str, str]) -> str | None:
    """XLA_PYTHON_CLIENT_ALLOCATOR as jaxmem models it (None: unset or "default", JAX's BFC)."""
    raw = str(env.get(ENV, "")).strip().lower()
    if raw in ("", "default"):
        return None
    if raw in KINDS:
        return raw
    if raw == "vmm":
        raise UserError(f"{ENV}=vmm: jaxmem does not model XLA's VMM allocator; unset it, or give --allocator "
                        f"{{{','.join(KINDS)}}} for the allocator the run will use")
    raise UserError(f"{ENV}={env[ENV]!r}: JAX takes default, bfc, platform or cuda_async; fix or unset it")


def read(env: Mapping[str, str], kind: str | None = None, mem_fraction: float | None = None) -> Allocator:
    """The allocator of the run: --allocator (`kind`) and --mem-fraction when given, else the environment's
    variables, else JAX's defaults (BFC, 0.75, preallocated). The usable note of the default and of the
    variables is the one jaxmem always wrote (reports and saved comparisons read it back)."""
    if kind is not None and kind not in KINDS:
        raise UserError(f"--allocator {kind}: one of {', '.join(KINDS)}")
    from_env = env_kind(env)
    chosen = kind or from_env or "bfc"
    kind_from = f"--allocator {kind}" if kind else (f"{ENV}={env[ENV]}" if from_env else "")
    prealloc = _preallocate(env)
    if chosen == "platform":
        if mem_fraction is not None:
            raise UserError(f"--mem-fraction {mem_fraction} with the platform allocator ({kind_from}): it allocates "
                            "from the whole card and reads no fraction; drop --mem-fraction, or give --allocator "
                            "bfc/cuda_async")
        who = kind_from.replace(" ", "=") if kind else kind_from
        return Allocator("platform", False, 1.0, f"{who}: {PLATFORM_NOTE}, less the runtime's memory outside the "
                         "pool", "user", "default", kind_from)
    if mem_fraction is not None:
        if not 0 < mem_fraction <= 1:
            raise UserError(f"--mem-fraction {mem_fraction}: must be in (0, 1]")
        frac, note, frac_src = mem_fraction, f"--mem-fraction {mem_fraction}", "user"
    else:
        given = env_fraction(env)
        if given is not None:
            (frac, src), frac_src = given, "user"
        else:
            frac, src, frac_src = DEFAULT_FRACTION, "JAX default: 75% of the card", "default"
        note = f"{src}, " + ("preallocated" if prealloc else "grown on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false)")
    if chosen == "cuda_async":
        note = f"cuda_async ({kind_from}): release threshold at {note}"
    return Allocator(chosen, prealloc, frac, note, "user" if kind_from else "default", frac_src, kind_from)


def from_note(note: str) -> list[tuple[str, float]]:
    """(Budget.mode, fraction) of each allocator setting a saved usable note allows: one, or two where the note
    leaves preallocation open (--mem-fraction). Raises ValueError for a note jaxmem does not write."""
    if note.startswith((f"{ENV}=platform", "--allocator=platform")):
        return [("platform", 1.0)]
    is_async = note.startswith("cuda_async (")
    if is_async:
        note = note.split("release threshold at ", 1)[-1]
    for prefix in ("--mem-fraction ", *(f"{n}=" for n in FRACTION_NAMES)):
        if note.startswith(prefix):
            frac = float(note[len(prefix):].split(",")[0].split()[0])
            break
    else:
        if not note.startswith("JAX default: 75% of the card"):
            raise ValueError(note)
        frac = DEFAULT_FRACTION
    modes = [True, False] if note.startswith("--mem-fraction") else ["grown on demand" not in note]
    return [(("async" if p else "async_grow") if is_async else ("prealloc" if p else "grow"), frac) for p in modes]


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def above_threshold(term: dict, note: str, total: int, outside: tuple[int, int],
                    band: tuple[float | None, float | None]) -> list[ReportWarning]:
    """allocator_above_threshold: under cuda_async the peak passes the release threshold (`term`: the verdict's
    ABOVE_THRESHOLD term); `outside`: the memory outside the pool (low, high); `band`: the fraction band."""
    threshold, peak = term["low_bytes"], term["high_bytes"]
    floor, ceiling = band
    fix = (f"set the memory fraction between {floor:.4g} and {ceiling:.4g} (XLA_PYTHON_CLIENT_MEM_FRACTION), so the "
           "pool keeps the whole peak between steps" if floor is not None and ceiling is not None and floor <= ceiling
           else "no fraction holds the peak beside the memory outside the pool at its high end: less peak (the "
                "hints above) or more devices")
    return [ReportWarning(
        "allocator_above_threshold",
        f"the peak, {_gib(peak)}, is above cuda_async's release threshold, {_gib(threshold)} ({note}): CUDA's async "
        f"pool does not cap it, so the step runs, but the {_gib(peak - threshold)} above the threshold goes back to "
        "the driver at each synchronization and is mapped again by the next step; that fails intermittently "
        f"(public runs: about once in 380 steps) when the memory outside the pool ({_gib(outside[0])}-"
        f"{_gib(outside[1])}: CUDA context, NCCL) and the temporaries cannot both be resident on the card's "
        f"{_gib(total)}. Never FITS: {fix}", peak - threshold)]
