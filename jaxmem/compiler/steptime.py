"""An estimated step time, from the compiled program itself: a per-kernel model at achieved rates.

The rule (an estimate, and labelled one wherever it is shown):

* **The kernels.** :mod:`jaxmem.compiler.kernels` lists each kernel the optimized, scheduled per-device
  program launches, with the HBM bytes it really moves (a slice of a loop-carried stack, the update of an
  in-place ``dynamic-update-slice``; bitcasts and tuples nothing) and its dot / attention FLOPs; a loop body
  runs once per trip (``known_trip_count``).
* **Each kernel** takes ``max(math / achieved rate, bytes / achieved HBM bandwidth, launch floor)``:
  GEMMs (cuBLAS custom calls, Triton GEMM fusions) at the Maximum Achievable Matmul FLOPS share of the peak
  for their operand types (:data:`GEMM_FRACTION`, by architecture) times their wave quantization on the
  card's SMs (:func:`wave_efficiency`), so small and skinny GEMMs fall far below peak or become
  memory-bound; cuDNN flash attention at its measured forward / backward rate; every other kernel is
  memory-bound at :data:`HBM_FRACTION` of the datasheet bandwidth; none below :data:`LAUNCH_FLOOR_S`.
* **Collectives** take a latency plus their ring wire bytes ((n-1)/n of the buffer, twice for an
  all-reduce) over NCCL's measured bus bandwidth on the link they cross (NVLink, NVLink SHARP for an
  all-reduce inside an NVSwitch host, the group's NICs across hosts).
* **Overlap as XLA scheduled it** (:func:`simulate`): kernels run on a compute stream and collectives on
  a communication stream in the program's order; an async collective hides behind exactly the compute
  between its ``*-start`` and ``*-done``, a synchronous one waits for both streams.
* **The band** (``low_s`` / ``high_s``): the same simulation with every rate at the fast and the slow end
  of its published range. ``compare`` and ``advise`` call rows whose bands overlap tied.

XLA's own GPU performance model (the analytical latency estimator its latency-hiding scheduler uses,
``xla_gpu_enable_analytical_latency_estimator``) is not reachable from Python: jaxlib exposes the
whole-module ``HloCostAnalysis`` (used here for FLOPs) but no per-instruction cost or the estimator's
latencies, and a deviceless compile prints no schedule timings. Every constant below names its
public measurement; none is fitted to the published step times that judge the estimate
(``python benchmarks/steptime_accuracy.py``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from jaxmem.report import ReportWarning
from jaxmem.xla import hlo_text
from jaxmem.xla.collectives import Collective, collectives

RULE = ("estimate = the step's kernels in XLA's schedule order, each max(its FLOPs at its class's achieved rate, "
        "its own HBM bytes at achieved bandwidth, a launch floor): GEMMs at the measured cuBLAS share of peak "
        "(MAMF) times wave quantization, cuDNN attention at its measured rate, other kernels at ~88% of HBM "
        "bandwidth; collectives at NCCL's measured bus bandwidth for the link (NVLink, NVLS, network) plus a "
        "latency, hidden only behind the compute XLA scheduled between their start and done; host copies at "
        "PCIe bandwidth; loops x trip count. Band: every rate at the ends of its published range")
LEAVES_OUT = ("host-side work (input pipeline, Python dispatch), GPU clocks below boost under power limits, "
              "bandwidth shared by concurrent collectives and compute, stragglers across hosts, shapes far from "
              "the measured ones (rates are per kernel class, not per shape beyond wave quantization)")


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """Per-device cost of one step of the program, loops counted by their trip counts."""

    flops: float
    bytes_accessed: float
    transcendentals: float
    xla_flops: float            # XLA's cost analysis of the module as it stands (each loop body once)
    custom_call_flops: float    # cuBLAS / cuDNN custom calls, from their shapes (XLA counts 0)
    loops: tuple[tuple[str, int | None], ...] = ()   # (while instruction, trip count)
    # FLOPs of the dots and GEMM/attention custom calls by the rate they run at: (kind, passes, flops)
    dot_flops: tuple[tuple[str, int, float], ...] = ()


def _cpu_client():
    import jax

    return jax.devices("cpu")[0].client


# XLA's cost of a whole program whose text was just printed from its XLA module
# (early_stop.print_module), so that costing it does not parse the text back (0.4 s of a gpt2-medium
# analysis). One slot, the latest compile's; matched by identity, so a text read from the cache
# is parsed.
_printed: tuple[str, dict[str, float]] | None = None


def printed_from(text: str, cost: dict[str, float]) -> None:
    """Remember that `text` printed a module whose whole cost (module_cost) is `cost`."""
    global _printed
    _printed = (text, dict(cost))


_MODULE_COST_KEYS = {"flops", "bytes accessed", "transcendentals"}


def printed_cost(text: str) -> dict[str, float] | None:
    """The module cost remembered for `text` (printed_from), or None."""
    printed = _printed
    return dict(printed[1]) if printed is not None and printed[0] is text else None


def remember_cost(text: str, cost: dict) -> None:
    """A cached compile's text with the module cost stored beside it (an early-stopped compile's
    Artifacts.cost: exactly module_cost's keys; a whole compile's cost_analysis() has others)."""
    if set(cost) == _MODULE_COST_KEYS:
        printed_from(text, cost)


def module_cost(module, client=None) -> dict[str, float]:
    """XLA's HloCostAnalysis of an XLA HloModule (backend-neutral for FLOPs and bytes; the CPU
    client only provides its shape-size function)."""
    from jax._src.lib import _jax

    cost = _jax.hlo_module_cost_analysis(client or _cpu_client(), module)
    return {k: float(cost.get(k, 0.0)) for k in ("flops", "bytes accessed", "transcendentals")}


def _xla_cost(text: str) -> dict[str, float]:
    """module_cost of an HLO module given as text."""
    from jaxmem.compiler import versions

    remembered = printed_cost(text)
    return remembered if remembered is not None else module_cost(versions.hlo_module_from_text(text))


def program_cost(module: hlo_text.Module) -> ProgramCost:
    """FLOPs, bytes accessed and transcendentals of one execution of the entry computation.

    XLA's HloCostAnalysis visits a while body once. So the entry and every loop body are
    analysed as modules of their own, and each contributes its own cost (its total minus the
    loop bodies directly inside it) times the number of times it runs per step.
    """
    roots = [module.entry]
    bodies_in: dict[str, list[str]] = defaultdict(list)  # computation -> loop bodies directly inside it
    for comp in module.computations.values():
        for ins in comp.instructions:
            if ins.opcode == "while":
                body = dict(ins.called).get("body")
                if body in module.computations:
                    bodies_in[comp.name].append(body)
                    roots.append(body)
    # A body reached through a non-loop call (a conditional branch, a call) belongs to the
    # nearest loop-or-entry root above it: find it by walking the callers.
    root_set = set(roots)
    owner: dict[str, str] = {}
    for root in roots:
        stack = [root]
        while stack:
            name = stack.pop()
            for ins in module.computations[name].instructions:
                for attr, callee in ins.called:
                    if callee not in module.computations:
                        continue
                    if ins.opcode == "while" and attr == "body":
                        owner.setdefault(callee, root)
                    elif callee not in root_set:
                        stack.append(callee)
    inner: dict[str, list[str]] = defaultdict(list)
    for body, root in owner.items():
        inner[root].append(body)

    whole = {r: _xla_cost(module.submodule_text(r)) for r in dict.fromkeys(roots)}
    mult = module.multiplicity
    total: defaultdict[str, float] = defaultdict(float)
    for root, cost in whole.items():
        own = {k: v - sum(whole[b][k] for b in inner.get(root, ())) for k, v in cost.items()}
        for k, v in own.items():
            total[k] += max(v, 0.0) * mult.get(root, 0)
    custom = sum(_custom_call_flops(module, ins) * mult.get(ins.computation, 0) for ins in module.instructions()
                 if ins.opcode == "custom-call")
    return ProgramCost(
        flops=total["flops"] + custom, bytes_accessed=total["bytes accessed"],
        transcendentals=total["transcendentals"], xla_flops=whole[module.entry]["flops"],
        custom_call_flops=custom, loops=tuple(sorted(module.trip_counts.items())),
        dot_flops=dot_flops(module),
    )


# XLA's dot algorithms (PrecisionConfig.Algorithm, printed `algorithm=dot_bf16_bf16_f32_x3` on a dot,
# "ALG_DOT_..." in a cuBLAS backend config): the rate they run at; a _xN suffix is N passes.
_ALGORITHMS = (("dot_any_f8_any_f8", "fp8"), ("dot_bf16_bf16", "bf16"), ("dot_f16_f16", "fp16"),
               ("dot_tf32_tf32", "tf32"), ("dot_f32_f32", "fp32"), ("dot_f64_f64", "other"))
_INT8 = ("s8", "u8", "s4", "u4")


def dot_kind(dtypes: list[str], precision: Sequence[str] = (), algorithm: str | None = None) -> tuple[str, int]:
    """(kind, passes): the rate a dot with operands of `dtypes` runs at, and how many times.

    The kinds: bf16, fp16, tf32, fp32 (CUDA cores), fp8, int8, other (f64 and wide integers: no
    tensor-core rate in the catalogue). An explicit algorithm decides; else the widest operand: fp32
    runs in TF32 unless an operand's precision is HIGHEST (JAX's DEFAULT and HIGH both give TF32 on GPU).
    """
    if algorithm:
        a = algorithm.lower().removeprefix("alg_")
        for prefix, kind in _ALGORITHMS:
            if a.startswith(prefix):
                m = re.search(r"_x(\d+)$", a)
                return kind, int(m.group(1)) if m else 1
    dts = set(dtypes)
    if not dts or dts - {"f32", "bf16", "f16", *_INT8} - {d for d in dts if d.startswith("f8")}:
        return "other", 1
    if "f32" in dts:
        return ("fp32" if any(p.lower() == "highest" for p in precision) else "tf32"), 1
    if "bf16" in dts:
        return "bf16", 1
    if "f16" in dts:
        return "fp16", 1
    if all(d.startswith("f8") for d in dts):
        return "fp8", 1
    if dts <= set(_INT8):
        return "int8", 1
    return "other", 1   # fp8 with int8 operands: no single rate


def _dims_attr(ins: hlo_text.Instruction, key: str) -> list[int]:
    text = ins.attr(key) or ""
    return [int(x) for x in re.findall(r"\d+", text)]


def loop_dot_share(module: hlo_text.Module, trip_count: int) -> float:
    """The share of the step's dot FLOPs run inside the while loops of `trip_count` iterations (and
    the computations they call): a pipeline's stage loops, forward and backward."""
    mult = module.multiplicity
    per_comp: dict[str, float] = defaultdict(float)   # computation -> its dots' FLOPs per step
    for ins, flops, _ in _dots(module):
        per_comp[ins.computation] += flops * mult.get(ins.computation, 0)
    total = sum(per_comp.values())
    if not total:
        return 0.0
    inside: set[str] = set()
    stack = [dict(ins.called).get("body") for ins in module.instructions()
             if ins.opcode == "while" and module.trip_counts.get(ins.name) == trip_count]
    while stack:
        name = stack.pop()
        if name is None or name in inside or name not in module.computations:
            continue
        inside.add(name)
        stack.extend(callee for ins in module.computations[name].instructions for _, callee in ins.called)
    return sum(f for c, f in per_comp.items() if c in inside) / total


def _dots(module: hlo_text.Module):
    """(instruction, FLOPs of one run, (kind, passes)) of every dot and GEMM / attention custom call
    that runs in the step."""
    mult = module.multiplicity
    for ins in module.instructions():
        if not mult.get(ins.computation, 0) or ins.opcode not in ("dot", "custom-call"):
            continue
        arrays = [a for a in _operand_shapes(module, ins) if isinstance(a, hlo_text.Array)]
        if len(arrays) < 2:
            continue
        if ins.opcode == "dot":
            dn = {f"{side}_{what}_dimensions": _dims_attr(ins, f"{side}_{what}_dims")
                  for side in ("lhs", "rhs") for what in ("contracting", "batch")}
            precision = re.findall(r"[a-z]+", ins.attr("operand_precision") or "")
            yield ins, _dot_flops(arrays[0], arrays[1], dn), dot_kind([a.dtype for a in arrays[:2]], precision,
                                                                       ins.attr("algorithm"))
        else:
            flops = _custom_call_flops(module, ins)
            if not flops:
                continue
            pc = ins.backend_config.get("gemm_backend_config", {}).get("precision_config", {})
            alg = pc.get("algorithm")
            yield ins, flops, dot_kind([a.dtype for a in arrays[:2]], pc.get("operand_precision", []),
                                       None if alg in (None, "ALG_UNSET") else alg)


def pipeline_time(step_time: dict, module: hlo_text.Module | str, *, iterations: int, bubble: float) -> dict:
    """The pipeline's bubble in a step estimate: every stage runs all `iterations` of the stage loop, and
    `bubble` of them on no microbatch (the SPMD program computes and discards them), so the estimate
    already holds it; this names how much (the loop's share of the dots, times the compute-or-memory time)."""
    if not step_time.get("available"):
        return {}
    mod = module if isinstance(module, hlo_text.Module) else hlo_text.parse_module(module)
    share = loop_dot_share(mod, iterations)
    busy = step_time["compute_s"] + step_time["memory_s"]   # the kernels, one after another
    return {"iterations": iterations, "bubble_share": bubble, "stage_loop_dot_share": share,
            "bubble_s": bubble * share * busy,
            "rule": "bubble = (N-1)/(M*R+N-1) of the stage loop's time; the stage loop's time = its share of the "
                    "step's dot FLOPs x the kernels' busy time (compute + memory); the estimate already counts the "
                    "bubble's iterations, which the SPMD program computes and discards"}


def dot_flops(module: hlo_text.Module) -> tuple[tuple[str, int, float], ...]:
    """FLOPs per step of every dot and GEMM / attention custom call, by (kind, passes) (see :func:`dot_kind`).

    A dot inside a fusion (Triton GEMM fusions hold theirs) counts as often as its fusion runs.
    """
    mult = module.multiplicity
    out: dict[tuple[str, int], float] = defaultdict(float)
    for ins, flops, kind in _dots(module):
        out[kind] += flops * mult.get(ins.computation, 0)
    return tuple((k, p, f) for (k, p), f in sorted(out.items()))


def _operand_shapes(module: hlo_text.Module, ins: hlo_text.Instruction) -> list:
    by_name = module.by_name
    return [by_name[n].shape if n in by_name else None for n in re.findall(r"%([\w.\-]+)", ins.operands)]


def _dims(d: dict, key: str) -> list[int]:
    return [int(x) for x in d.get(key, [])]


def _dot_flops(lhs: hlo_text.Array, rhs: hlo_text.Array, dn: dict) -> float:
    """2 x batch x lhs-free x rhs-free x contracted, from XLA dot dimension numbers."""
    lc, rc = _dims(dn, "lhs_contracting_dimensions"), _dims(dn, "rhs_contracting_dimensions")
    lb, rb = _dims(dn, "lhs_batch_dimensions"), _dims(dn, "rhs_batch_dimensions")
    batch = math.prod(lhs.dims[i] for i in lb)
    contract = math.prod(lhs.dims[i] for i in lc)
    lfree = math.prod(d for i, d in enumerate(lhs.dims) if i not in lc and i not in lb)
    rfree = math.prod(d for i, d in enumerate(rhs.dims) if i not in rc and i not in rb)
    return 2.0 * batch * lfree * rfree * contract


# Q·Kᵀ for (batch, seq, heads, head_dim) operands: contract head_dim, batch over batch and heads.
_BTHD_SCORES = {"lhs_contracting_dimensions": [3], "rhs_contracting_dimensions": [3],
                "lhs_batch_dimensions": [0, 2], "rhs_batch_dimensions": [0, 2]}


def _custom_call_flops(module: hlo_text.Module, ins: hlo_text.Instruction) -> float:
    """FLOPs of the custom calls XLA's cost analysis counts as zero.

    cuBLAS GEMMs (``__cublas$gemm``, ``__cublas$lt$matmul``, ``...$f8``): from the operand shapes and
    the dot dimension numbers in their backend config. cuDNN fused attention
    (``__cudnn$fmha*``): the forward pass is two GEMMs of the size of Q·Kᵀ (scores, then
    probabilities·V), the backward five (recomputed scores, dV, dP, dQ, dK); a causal mask
    halves both, as cuDNN skips the masked tiles.
    """
    target = (ins.attr("custom_call_target") or "").strip('"')
    cfg = ins.backend_config
    shapes = _operand_shapes(module, ins)
    arrays = [s for s in shapes if isinstance(s, hlo_text.Array)]
    # cuBLASLt's targets: ``__cublas$lt$matmul`` and its FP8 form ``__cublas$lt$matmul$f8`` (operands A, B,
    # then the scales): XLA rewrites FP8 dots of GEMM size into the latter
    if (target.startswith("__cublas$") and "gemm" in target.lower()) or target.startswith("__cublas$lt$matmul"):
        dn = cfg.get("gemm_backend_config", {}).get("dot_dimension_numbers")
        if dn is None or len(arrays) < 2:
            return 0.0
        return _dot_flops(arrays[0], arrays[1], dn)
    if target.startswith("__cudnn$fmha"):
        fmha = cfg.get("cudnn_fmha_backend_config", {})
        if len(arrays) < 2:
            return 0.0
        backward = "Backward" in target
        # Q·Kᵀ from operands 0 and 1 (Q, K in both directions). The backward config names only its
        # gradient GEMMs; Q and K then come in jax's (batch, seq, heads, head_dim) order.
        dn = fmha.get("bmm1_dot_dimension_numbers", _BTHD_SCORES)
        one = _dot_flops(arrays[0], arrays[1], dn)
        causal = str(fmha.get("mask_type", "")).upper() == "CAUSAL"
        return one * (5 if backward else 2) * (0.5 if causal else 1.0)
    return 0.0


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


def host_transfer_bytes(module: hlo_text.Module) -> int:
    """Bytes moved between device and pinned host memory (memory space S(5)) per step: the
    ``copy-start``/``copy`` instructions whose source or destination lives on the host, the
    ``dynamic-update-slice`` writes into a host buffer and the ``dynamic-slice`` reads from one
    (how XLA's host offloader moves a scanned layer's offloaded activations, one layer per
    iteration), and the entry parameters that live there (read over PCIe by the kernels that use
    them, once)."""
    mult = module.multiplicity
    by_name = module.by_name
    total = sum(hlo_text.shape_bytes(ins.shape) for ins in module.computations[module.entry].instructions
                if ins.opcode == "parameter" and "S(5)" in ins.shape_text)
    for ins in module.instructions():
        if ins.computation not in mult or ins.opcode not in ("copy-start", "copy", "dynamic-update-slice",
                                                             "dynamic-slice"):
            continue
        operands = [by_name[n] for n in re.findall(r"%([\w.\-]+)", ins.operands) if n in by_name]
        if ins.opcode == "dynamic-update-slice":
            if "S(5)" in ins.shape_text and len(operands) > 1:   # the update goes to the host
                total += hlo_text.shape_bytes(operands[1].shape) * mult[ins.computation]
        elif ins.opcode == "dynamic-slice":
            if operands and "S(5)" in operands[0].shape_text and "S(5)" not in ins.shape_text:
                total += hlo_text.shape_bytes(ins.shape) * mult[ins.computation]
        elif "S(5)" in ins.shape_text or any("S(5)" in o.shape_text for o in operands):
            shape = ins.shape[0] if isinstance(ins.shape, tuple) else ins.shape  # copy-start: (dest, src, ctx)
            total += hlo_text.shape_bytes(shape) * mult[ins.computation]
    return total


def communication(colls: list[Collective], perf, devices_per_host: int) -> tuple[float, list[dict]]:
    """Seconds the collectives take per step (ring algorithms, see the module docstring), and one
    row per (kind, mesh axes, link) with its count, bytes, wire bytes and time."""
    rows: dict[tuple, dict] = {}
    total = 0.0
    for c in colls:
        link, bw = _link(c, devices_per_host, perf)
        wire = _wire_factor(c) * c.bytes_per_step
        t = wire / bw
        total += t
        key = (c.kind, c.axes, link)
        row = rows.setdefault(key, {"kind": c.kind, "axes": list(c.axes), "link": key[2], "count": 0,
                                    "bytes": 0, "wire_bytes": 0.0, "time_s": 0.0})
        row["count"] += c.count_in_loop
        row["bytes"] += c.bytes_per_step
        row["wire_bytes"] += wire
        row["time_s"] += t
    for row in rows.values():
        row["wire_bytes"] = int(row["wire_bytes"])
    return total, sorted(rows.values(), key=lambda r: -r["time_s"])


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


def compute_peaks(cost: ProgramCost, perf) -> list[dict[str, Any]]:
    """The compute term's parts: one row per rate (dot kind and passes, then the non-dot FLOPs), each
    with its FLOPs, share of all FLOPs, peak and time (FLOPs x passes / peak), most FLOPs first."""
    rows = []
    dots = sum(f for _, _, f in cost.dot_flops)
    # XLA counts each dot with the formula of _dot_flops: what is left is the non-dot work
    for kind, passes, flops in [*cost.dot_flops, ("non-dot", 1, max(cost.flops - dots, 0.0))]:
        if not flops:
            continue
        field, label = _PEAKS[kind]
        peak = getattr(perf, field)
        if peak is None:
            peak, label = perf.bf16_flops, f"{label} not on this card: at the bf16 rate"
        if passes > 1:
            label = f"{label}, {passes} passes"
        rows.append({"kind": kind, "passes": passes, "label": label, "peak_flops": peak, "flops": flops,
                     "share": flops / cost.flops if cost.flops else 0.0, "time_s": flops * passes / peak})
    return sorted(rows, key=lambda r: -r["flops"])


def peaks_text(rows: list[dict[str, Any]]) -> str:
    """`989 TFLOP/s (bf16 dense tensor) for 98% of FLOPs, 67 (fp32 CUDA cores: ...) for 2%`."""
    def pct(x: float) -> str:
        return f"{100 * x:.0f}%" if x >= 0.01 or x == 0 else f"{100 * x:.1g}%"

    return ", ".join(f"{r['peak_flops'] / 1e12:,.0f}{' TFLOP/s' if i == 0 else ''} ({r['label']}) for "
                     f"{pct(r['share'])}{' of FLOPs' if i == 0 else ''}" for i, r in enumerate(rows))


def estimate(hlo: str | hlo_text.Module, *, mesh_axes, hosts: int, gpu: str) -> dict[str, Any]:
    """The step-time estimate of a compiled program, as the Report's ``step_time`` (plain values).

    `gpu`: a catalogue key (``jaxmem gpus``); other targets (cpu) get no estimate. The compute
    precision is read from the program's dots, not from the options that built it.
    """
    from jaxmem.compiler import kernels as kernels_mod
    from jaxmem.compiler import targets

    perf = targets.performance(gpu)
    if perf is None:
        return {"label": "estimate", "available": False,
                "reason": f"no published peak rates for {gpu!r}: step times are estimated for the catalogue GPUs"}
    if not hlo:
        return {"label": "estimate", "available": False, "reason": "the backend printed no optimized program"}
    try:
        module = hlo if isinstance(hlo, hlo_text.Module) else hlo_text.parse_module(hlo)
        cost = program_cost(module)
        colls = collectives(module, mesh_axes)
        host_bytes = host_transfer_bytes(module)
        ks = kernels_mod.kernels(module)
    except Exception as e:  # noqa: BLE001 -- an unreadable program gets no number rather than a wrong one, or a crash
        return {"label": "estimate", "available": False,
                "reason": f"could not cost the compiled program ({type(e).__name__}: {str(e)[:200]})"}
    n_devices = math.prod(s for _, s in mesh_axes) or 1
    per_host = max(n_devices // max(hosts, 1), 1)
    dph = max(per_host, perf.nvlink_domain or 0)
    peaks = compute_peaks(cost, perf)
    host_s = host_bytes / perf.host_bandwidth if host_bytes else 0.0
    ends = {end: simulate(module, ks, colls, perf, rates(gpu, perf, end), dph) for end in ("fast", "central", "slow")}
    sim = ends["central"]
    busy = sim["busy"]
    compute_s = busy.get("gemm", 0.0) + busy.get("attention", 0.0)
    memory_s = busy.get("memory", 0.0)
    comm_s = busy.get("collective", 0.0)
    rows = communication_rows(colls, perf, rates(gpu, perf), dph)
    bytes_moved = kernels_mod.bytes_per_step(ks)
    classes = []
    for klass in ("gemm", "attention", "memory", "collective"):
        mine = [k for k in ks if k.klass == klass]
        if klass == "collective":
            n = sum(c.count_in_loop for c in colls)
            if n:
                classes.append({"class": klass, "launches": n, "time_s": comm_s,
                                "bytes": sum(c.bytes_per_step for c in colls), "flops": 0.0})
            continue
        if mine:
            classes.append({"class": klass, "launches": sum(k.runs for k in mine), "time_s": busy.get(klass, 0.0),
                            "bytes": sum(k.bytes * k.runs for k in mine),
                            "flops": sum(k.flops * k.runs for k in mine)})
    return {
        "label": "estimate",
        "available": True,
        "estimate_s": sim["step_s"] + host_s,
        "low_s": ends["fast"]["step_s"] + host_s,
        "high_s": ends["slow"]["step_s"] + host_s,
        # every collective hidden: the kernels alone
        "overlapped_s": max(compute_s + memory_s, comm_s, host_s),
        "compute_s": compute_s,
        "memory_s": memory_s,
        "communication_s": comm_s,
        "exposed_communication_s": max(sim["step_s"] - compute_s - memory_s, 0.0),
        "host_transfer_s": host_s,
        "host_transfer_bytes": host_bytes,
        "bound": "compute" if compute_s >= memory_s else "memory",
        "flops": cost.flops,
        "xla_flops_loops_once": cost.xla_flops,
        "custom_call_flops": cost.custom_call_flops,
        "bytes_accessed": bytes_moved,
        # XLA's HloCostAnalysis count (every operand whole: a loop's stacked buffers per trip)
        "xla_bytes_accessed": cost.bytes_accessed,
        "collective_bytes": sum(c.bytes_per_step for c in colls),
        "collectives": rows,
        "kernel_classes": classes,
        # loops XLA proved no trip count for count once: the estimate is then low, and says so
        "loops": [{"instruction": n, "trip_count": t} for n, t in cost.loops],
        "loops_counted_once": [n for n, t in cost.loops if t is None],
        # the rate all FLOPs together run at (flops / their peak time), and the peak rates it is made of
        "peak_flops": cost.flops / sum(r["time_s"] for r in peaks) if peaks else perf.bf16_flops,
        "peak_flops_kind": peaks_text(peaks) or "no FLOPs",
        "compute_peaks": peaks,
        "hbm_bandwidth": perf.hbm_bandwidth,
        "intra_host_bandwidth": perf.intra_host_bandwidth,
        "inter_host_bandwidth": perf.inter_host_bandwidth,
        "host_bandwidth": perf.host_bandwidth,
        "rate_sources": dict(RATE_SOURCES),
        "rule": RULE,
        "leaves_out": LEAVES_OUT,
    }


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


# cuBLAS(Lt) GEMMs: the Maximum Achievable Matmul FLOPS (MAMF) of a brute-force shape search, as a
# share of the datasheet peak, by architecture (compute capability major).
GEMM_FRACTION: dict[int, Rate] = {
    8: Rate(0.822, 0.859, 0.859, "stas00/ml-engineering compute/accelerator/README.md, Maximum Achievable Matmul "
                                 "FLOPS table (mamf-finder.py, BF16): A100 SXM 267.9 of 312 TFLOPS (85.9%), A100 "
                                 "PCIe 256.4 (82.2%)"),
    9: Rate(0.801, 0.801, 0.830, "stas00/ml-engineering compute/accelerator/README.md, MAMF table (BF16): H100 SXM "
                                 "792.1 of 989 TFLOPS (80.1%, CUDA 12.1), GH200 821.0 (83.0%, CUDA 12.5)"),
    # no MAMF row for Blackwell in that table: Hopper's, said so in the note
    10: Rate(0.801, 0.801, 0.830, "no published MAMF for Blackwell: Hopper's (stas00/ml-engineering MAMF table, "
                                  "H100 SXM 80.1%, GH200 83.0%), assumed"),
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
# wave quantization: a GEMM's output is cut into tiles, one per SM at a time; the last wave runs partly
# empty (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background": tile and wave
# quantization). cuBLAS's large-GEMM tiles on Hopper/Ampere: 128 x 256 (the guide's example size).
GEMM_TILE = (128, 256)

RATE_SOURCES = {
    "gemm": "GEMM_FRACTION (by architecture) x wave quantization (NVIDIA Deep Learning Performance Guide)",
    "attention": ATTENTION_FWD_FRACTION.source + "; " + ATTENTION_BWD_FRACTION.source,
    "memory": HBM_FRACTION.source,
    "launch": LAUNCH_FLOOR_S.source,
    "nvlink": NVLINK_FRACTION.source,
    "nvls": NVLS_ALLREDUCE_FRACTION.source,
    "network": NETWORK_FRACTION.source,
    "latency": COLLECTIVE_LATENCY_S["network"].source,
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


def rates(gpu: str, perf, end: str = "central") -> Rates:
    """The achieved rates of catalogue card `gpu` (`end`: fast, central or slow)."""
    from jaxmem.compiler import targets

    spec = targets.CATALOGUE.get(gpu)
    major = spec.compute_capability[0] if spec is not None else 9
    fast = {"fast": "high", "central": "central", "slow": "low"}[end]
    slow = {"fast": "low", "central": "central", "slow": "high"}[end]   # for times: fast = the short end
    gemm = GEMM_FRACTION.get(major, GEMM_FRACTION[9])
    return Rates(
        gemm_fraction=_pick(gemm, fast),
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
        nvls=gpu in _NVLS_CARDS,
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
        rate = peak * r.gemm_fraction * wave_efficiency(k.gemm_dims, r.sm_count)
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
        latency = r.latency_network_s
    elif nvls and c.kind == "all-reduce" and c.group_size >= 4:
        busbw, latency, link = bw * r.nvls_fraction, r.latency_intra_s, link + " (NVLS)"
    else:
        busbw, latency = bw * r.nvlink_fraction, r.latency_intra_s
    return latency + wire / busbw, link


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
               "fusion-done", "copy-done", "send-done", "recv-done"}


def simulate(module: hlo_text.Module, ks: list, colls: list[Collective], perf, r: Rates,
             devices_per_host: int) -> dict[str, Any]:
    """The step's time with overlap as XLA scheduled it.

    Each computation runs its instructions in the printed (scheduled) order on two streams: kernels on
    the compute stream, collectives on the communication stream. An async collective starts when its
    ``*-start`` is reached (and the communication stream is free) and is waited for at its ``*-done``:
    it hides behind exactly the compute XLA placed between the two. A synchronous collective waits for
    both streams. A ``while`` runs its body trip-count times; a conditional its longest branch.
    """
    by_kernel = {(k.computation, k.name): k for k in ks}
    coll_by = {(c.computation, c.name): c for c in colls}
    times: dict[tuple[str, str], float] = {}
    memo: dict[str, float] = {}

    def kt(k) -> float:
        key = (k.computation, k.name)
        if key not in times:
            times[key] = kernel_time(k, perf, r)
        return times[key]

    def run(cname: str) -> float:
        if cname in memo:
            return memo[cname]
        comp = module.computations.get(cname)
        if comp is None:
            return 0.0
        tc = tm = 0.0
        ends: dict[str, float] = {}
        for ins in comp.instructions:
            key = (cname, ins.name)
            if key in coll_by:
                c = coll_by[key]
                t, _ = collective_time(c, perf, r, devices_per_host, r.nvls)
                if ins.opcode.endswith("-start") or ins.opcode == "async-start":
                    start = max(tc, tm)
                    tm = start + t
                    ends[ins.name] = tm
                else:
                    tc = tm = max(tc, tm) + t
                continue
            if ins.opcode in _START_DONE:
                ops = re.findall(r"%([\w.\-]+)", ins.operands)
                if ops and ops[0] in ends:
                    tc = max(tc, ends.pop(ops[0]))
                continue
            if ins.opcode == "while":
                called = dict(ins.called)
                trips = module.trip_counts.get(ins.name) or 1
                body, cond = called.get("body"), called.get("condition")
                # a collective started before the loop may run on behind it (XLA schedules some so)
                tc = tc + trips * (run(body) if body else 0.0) + (trips + 1) * (run(cond) if cond else 0.0)
                continue
            if ins.opcode in ("conditional", "call"):
                branches = [c for a, c in ins.called if c in module.computations and a != "to_apply"] \
                    if ins.opcode == "conditional" else [c for _, c in ins.called if c in module.computations]
                if branches:
                    tc += max(run(b) for b in branches)
                continue
            k = by_kernel.get(key)
            if k is not None and k.klass != "collective":
                tc += kt(k)
        out = max(tc, tm, *ends.values()) if ends else max(tc, tm)
        memo[cname] = out
        return out

    step = run(module.entry)
    busy: dict[str, float] = defaultdict(float)     # class -> seconds its kernels run per step
    for k in ks:
        if k.klass != "collective":
            busy[k.klass] += kt(k) * k.runs
    for c in colls:
        busy["collective"] += collective_time(c, perf, r, devices_per_host, r.nvls)[0] * c.count_in_loop
    return {"step_s": step, "busy": dict(busy)}


def band(st: dict | None) -> tuple[float, float, float] | None:
    """(estimate, low, high) of a report's step_time (low = high = estimate for a report saved before
    the band), or None without an estimate."""
    if not st or not st.get("available"):
        return None
    e = st["estimate_s"]
    return e, st.get("low_s", e), st.get("high_s", e)


def tied_with(bands: list[tuple[float, float, float] | None]) -> list[int | None]:
    """For rows ranked by their estimates (fastest first): for each row, the index of the first row
    above it whose band overlaps its own (the two are tied: their order is within the model's own
    spread), or None. Rows without an estimate tie with nothing."""
    out: list[int | None] = []
    for i, b in enumerate(bands):
        hit = None
        if b is not None:
            for j in range(i):
                o = bands[j]
                if o is not None and o[1] <= b[2] and b[1] <= o[2]:
                    hit = j
                    break
        out.append(hit)
    return out


def check_precision(precision: str, step_time: dict) -> list[ReportWarning]:
    """precision_no_effect: --precision bf16/bf16-pure/fp8 whose matmuls still run in fp32: the model
    fixes its layers' dtype (dtype=jnp.float32), so the flag changed the casts, not the dots."""
    if precision not in ("bf16", "bf16-pure", "fp8") or not step_time.get("available"):
        return []
    dots = [p for p in step_time.get("compute_peaks", []) if p["kind"] != "non-dot"]
    total = sum(p["flops"] for p in dots)
    low = sum(p["flops"] for p in dots if p["kind"] in ("bf16", "fp16", "fp8", "int8"))
    if not total or low / total >= 0.5:
        return []
    kinds = ", ".join(f"{p['kind']} {p['flops'] / total:.0%}" for p in sorted(dots, key=lambda p: -p["flops"]))
    return [ReportWarning("precision_no_effect",
                          f"--precision {precision} left {1 - low / total:.0%} of the matmul FLOPs in 32-bit (dots by "
                          f"type: {kinds}): "
                          "the model's layers fix their own compute dtype (dtype=jnp.float32), so the flag changed "
                          "only the casts of the parameters and inputs; set the layers' dtype to change the matmuls")]
