"""An estimated step time, from the compiled program itself: a per-kernel model at achieved rates.

The rule (an estimate, and labelled one wherever it is shown):

* **The kernels.** :mod:`jaxmem.compiler.kernels` lists each kernel the optimized, scheduled per-device
  program launches, with the HBM bytes it really moves (a slice of a loop-carried stack, the update of an
  in-place ``dynamic-update-slice``; bitcasts and tuples nothing) and its dot / attention FLOPs; a loop body
  runs once per trip (``known_trip_count``).
* **Each kernel** takes ``max(math / achieved rate, bytes / achieved HBM bandwidth, launch floor)``:
  GEMMs (cuBLAS custom calls, Triton GEMM fusions) at the Maximum Sustainable Matmul FLOPS share of the
  peak for their operand types (:data:`GEMM_FRACTION`, :data:`FP8_GEMM_FRACTION`, by architecture: the
  rate a node of GPUs at their power limit holds) times their wave quantization on the
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
from collections.abc import Mapping
from typing import Any

import jax
from jax._src.lib import _jax

from jaxmem.compiler import kernels as kernels_mod
from jaxmem.compiler import rates as rates_mod
from jaxmem.compiler import residuals, schedule, targets, versions
from jaxmem.compiler.dots import (  # noqa: F401  (the dots' readers, re-exported where they were)
    _ALGORITHMS,
    _BTHD_SCORES,
    _INT8,
    _custom_call_flops,
    _dims,
    _dims_attr,
    _dot_flops,
    _dots,
    _operand_shapes,
    dot_flops,
    dot_kind,
    loop_dot_share,
)
from jaxmem.compiler.rates import (  # noqa: F401  (the achieved rates, re-exported where they were)
    _NVLS_CARDS,
    _PEAKS,
    _START_DONE,
    ATTENTION_BWD_FRACTION,
    ATTENTION_FWD_FRACTION,
    COLLECTIVE_LATENCY_S,
    FP8_GEMM_FRACTION,
    GEMM_FRACTION,
    GEMM_TILE,
    HBM_FRACTION,
    LAUNCH_FLOOR_S,
    NETWORK_FRACTION,
    NVLINK_FRACTION,
    NVLS_ALLREDUCE_FRACTION,
    OVERLAP_SLOWDOWN,
    RATE_SOURCES,
    RING_STEP_LATENCY_S,
    Rate,
    Rates,
    _link,
    _pick,
    _wire_factor,
    collective_time,
    communication_rows,
    kernel_time,
    simulate,
    wave_efficiency,
)
from jaxmem.report import ReportWarning, StepTime
from jaxmem.xla import hlo_text
from jaxmem.xla.collectives import Collective, collectives

rates = rates_mod.rates   # re-exported where it was

RULE = ("estimate = the step's kernels in XLA's schedule order, each max(its FLOPs at its class's achieved rate, "
        "its own HBM bytes at achieved bandwidth, a launch floor): GEMMs at the sustained cuBLAS share of peak "
        "(MSMF: a whole node at its power limit) times wave quantization, cuDNN attention at its measured rate, "
        "other kernels at ~88% of HBM "
        "bandwidth; collectives at NCCL's measured bus bandwidth for the link (NVLink, NVLS, network) plus a "
        "latency, hidden only behind the compute XLA scheduled between their start and done, which runs ~19% slower "
        "beside them; host copies at "
        "PCIe bandwidth; loops x trip count. Band: every rate at the ends of its published range")
LEAVES_OUT = ("host-side work (input pipeline, Python dispatch), "
              "contention beside collectives beyond its measured average, stragglers across hosts, shapes far from "
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
    return jax.devices("cpu")[0].client


# XLA's cost of the whole module an early-stopped compile printed its text from (early_stop.print_module)
# is kept with the text (Artifacts.cost), so that costing it does not parse the text back (0.4 s of a
# gpt2-medium analysis; and jaxlib 0.12 cannot parse some of what it prints): the caller passes it to
# estimate() / program_cost() as `whole_cost`. A whole compile's cost_analysis() has other keys.
_MODULE_COST_KEYS = {"flops", "bytes accessed", "transcendentals"}


def whole_cost(cost: dict) -> dict[str, float] | None:
    """`cost` (an Artifacts') when it is XLA's cost of the whole printed module (exactly module_cost's
    keys: an early-stopped compile's, fresh or cached), else None (the text is parsed and costed)."""
    return dict(cost) if set(cost) == _MODULE_COST_KEYS else None


def module_cost(module, client=None) -> dict[str, float]:
    """XLA's HloCostAnalysis of an XLA HloModule (backend-neutral for FLOPs and bytes; the CPU
    client only provides its shape-size function)."""

    cost = _jax.hlo_module_cost_analysis(client or _cpu_client(), module)
    return {k: float(cost.get(k, 0.0)) for k in ("flops", "bytes accessed", "transcendentals")}


def _xla_cost(text: str, known: dict[str, float] | None = None) -> dict[str, float]:
    """module_cost of an HLO module given as text (`known`: that cost, kept from when it was printed)."""

    return dict(known) if known is not None else module_cost(versions.hlo_module_from_text(text))


def program_cost(module: hlo_text.Module, whole_cost: dict[str, float] | None = None) -> ProgramCost:
    """FLOPs, bytes accessed and transcendentals of one execution of the entry computation.
    `whole_cost`: XLA's cost of the whole module (:func:`whole_cost`), where the caller has it.

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

    whole = {r: _xla_cost(module.submodule_text(r), whole_cost if r == module.entry else None)
             for r in dict.fromkeys(roots)}
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
def pipeline_time(step_time: Mapping[str, Any], module: hlo_text.Module | str, *, iterations: int,
                  bubble: float) -> dict:
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


def estimate(hlo: str | hlo_text.Module, *, mesh_axes, hosts: int, gpu: str,
             whole_cost: dict[str, float] | None = None) -> StepTime:
    """The step-time estimate of a compiled program, as the Report's ``step_time`` (plain values).
    `whole_cost`: XLA's cost of the whole module the program was printed from (:func:`whole_cost`).

    `gpu`: a catalogue key (``jaxmem gpus``); other targets (cpu) get no estimate. The compute
    precision is read from the program's dots, not from the options that built it.
    """

    perf = targets.performance(gpu)
    if perf is None:
        return {"label": "estimate", "available": False,
                "reason": f"no published peak rates for {gpu!r}: step times are estimated for the catalogue GPUs"}
    if not hlo:
        return {"label": "estimate", "available": False, "reason": "the backend printed no optimized program"}
    try:
        module = hlo if isinstance(hlo, hlo_text.Module) else hlo_text.parse_module(hlo)
        cost = program_cost(module, whole_cost)
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
    ends = {end: simulate(module, ks, colls, perf, rates_mod.rates(gpu, perf, end), dph)
            for end in ("fast", "central", "slow")}
    sim = ends["central"]
    busy = sim["busy"]
    compute_s = busy.get("gemm", 0.0) + busy.get("attention", 0.0)
    memory_s = busy.get("memory", 0.0)
    comm_s = busy.get("collective", 0.0)
    central = rates_mod.rates(gpu, perf)
    alone_s = schedule.unoverlapped_collective_seconds(module, colls, ks, perf, central, dph)
    return {
        "label": "estimate", "available": True,
        "estimate_s": sim["step_s"] + host_s,
        "low_s": ends["fast"]["step_s"] + host_s,
        "high_s": ends["slow"]["step_s"] + host_s,
        # every collective hidden: the kernels alone
        "overlapped_s": max(compute_s + memory_s, comm_s, host_s),
        "compute_s": compute_s,
        "memory_s": memory_s,
        "communication_s": comm_s,
        "overlap_slowdown_s": sim["overlap_slowdown_s"],    # lost beside collectives in flight (OVERLAP_SLOWDOWN)
        "exposed_communication_s": max(sim["step_s"] - compute_s - memory_s - sim["overlap_slowdown_s"], 0.0),
        # busy seconds of the collectives with no kernel beside them (synchronous, or a start right before its done)
        "unoverlapped_collective_s": alone_s,
        "host_transfer_s": host_s,
        "host_transfer_bytes": host_bytes,
        "bound": "compute" if compute_s >= memory_s else "memory",
        "flops": cost.flops,
        "xla_flops_loops_once": cost.xla_flops,
        "custom_call_flops": cost.custom_call_flops,
        "bytes_accessed": kernels_mod.bytes_per_step(ks),
        # XLA's HloCostAnalysis count (every operand whole: a loop's stacked buffers per trip)
        "xla_bytes_accessed": cost.bytes_accessed,
        "collective_bytes": sum(c.bytes_per_step for c in colls),
        "collectives": communication_rows(colls, perf, central, dph),
        "kernel_classes": _kernel_classes(ks, colls, busy),
        "dequantization": dequantization(ks, perf, central),
        # a scan's saved residuals: their stacks' traffic against the math --remat full would redo (residuals.py)
        "scan_residuals": residuals.scan_residuals(module, ks, perf, central),
        "xla_remat": xla_remat(ks, perf, central),
        # loops XLA proved no trip count for count once: the estimate is then low, and says so
        "loops": [{"instruction": n, "trip_count": t} for n, t in cost.loops],
        "loops_counted_once": [n for n, t in cost.loops if t is None],
        **_rates_used(cost, perf, peaks),
    }


def _rates_used(cost, perf, peaks: list) -> StepTime:
    """The estimate's rates as the Report states them: the rate all FLOPs together run at (flops / their
    peak time) and the peak rates it is made of, the card's bandwidths, their sources, the rule and what
    it leaves out."""
    return {
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


def _kernel_classes(ks, colls, busy: dict[str, float]) -> list[dict[str, Any]]:
    """The step's kernels by class (launches, simulated busy time, bytes, FLOPs), collectives last."""
    classes = []
    for klass in ("gemm", "attention", "memory", "collective"):
        mine = [k for k in ks if k.klass == klass]
        if klass == "collective":
            n = sum(c.count_in_loop for c in colls)
            if n:
                classes.append({"class": klass, "launches": n, "time_s": busy.get("collective", 0.0),
                                "bytes": sum(c.bytes_per_step for c in colls), "flops": 0.0})
            continue
        if mine:
            classes.append({"class": klass, "launches": sum(k.runs for k in mine), "time_s": busy.get(klass, 0.0),
                            "bytes": sum(k.bytes * k.runs for k in mine),
                            "flops": sum(k.flops * k.runs for k in mine)})
    return classes


# XLA's rematerialization names its clones <name>.remat, <name>.remat2, ... (compiled.xla_rematerialized)
_REMAT_NAME = re.compile(r"\.remat\d*\b")


def xla_remat(ks, perf, r) -> dict[str, Any]:
    """What XLA's rematerialization recomputes each step: the kernels whose names carry its clones' suffix,
    their launches, their seconds in the estimate (each at its own rate, as the simulation times it), FLOPs
    and bytes. Zeros where XLA recomputed nothing (the step was under its memory limit)."""
    mine = [k for k in ks if k.klass != "collective" and _REMAT_NAME.search(k.name)]
    return {"launches": sum(k.runs for k in mine),
            "seconds": sum((kernel_time(k, perf, r) * k.runs for k in mine), 0.0),
            "flops": sum((k.flops * k.runs for k in mine), 0.0), "bytes": sum((k.bytes * k.runs for k in mine), 0.0)}


def dequantization(ks, perf, r) -> dict[str, Any] | None:
    """A quantized base's dequantization as the kernels run it (None: the program reads no integer codes).

    qwix stores a frozen int8 / int4 / NF4 base as integer codes and scales; every matmul that uses the
    weight turns it back into the compute dtype, in the forward pass, in the remat's forward and in the
    backward pass's input gradient. XLA either writes the dequantized weight out in a fusion of its own
    (a memory-bound kernel: codes read, floats written, both at HBM bandwidth: `separate`) or fuses the
    decoding into the GEMM's operand load (`in_gemm`: the GEMM reads the codes; its time is the GEMM's). Both
    are in the estimate already, kernel by kernel; this names them, so that a QLoRA step's time beside LoRA's
    shows what the decoding costs (a 16-bit base is read as stored, but XLA may copy it: a scan's per-layer
    slice of the stacked weights, which a quantized base's decoding does in the same pass)."""
    separate = [k for k in ks if k.dequantized_bytes and k.klass != "gemm"]
    fused = [k for k in ks if k.dequantized_bytes and k.klass == "gemm"]
    if not separate and not fused:
        return None
    return {
        "separate_launches": sum(k.runs for k in separate),
        "separate_bytes": sum(k.bytes * k.runs for k in separate),
        "separate_s": sum(kernel_time(k, perf, r) * k.runs for k in separate),
        "in_gemm_launches": sum(k.runs for k in fused),
        "in_gemm_code_bytes": sum(k.dequantized_bytes * k.runs for k in fused),
        "code_bytes": sum(k.dequantized_bytes * k.runs for k in separate + fused),
    }


def band(st: Mapping[str, Any] | None) -> tuple[float, float, float] | None:
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


def check_pipeline_reductions(step_time: Mapping[str, Any], roles: Mapping[str, Any]) -> list[ReportWarning]:
    """gradient_reduced_per_iteration: a pipeline whose loop all-reduces the stages' gradients over the
    data-parallel axes on every iteration. XLA's while-loop all-reduce code motion sinks an all-reduce
    whose result is only added to an accumulator; a stage that scans over several layers writes each
    layer's gradient into a stacked buffer instead, which the pass does not match (with one layer per
    stage the all-reduce leaves the loop). A pipeline that sums its microbatches' gradients before
    reducing them pays this once, not once per iteration."""
    pipe = step_time.get("pipeline") if step_time.get("available") else None
    if not pipe or not pipe.get("iterations"):
        return []
    iterations = pipe["iterations"]
    dp = {name for name, r in roles.items() if r.get("role") in ("data", "fsdp")}
    rows = [c for c in step_time.get("collectives", []) if c["kind"] in ("all-reduce", "reduce-scatter")
            and c["axes"] and set(c["axes"]) <= dp and c["count"] >= iterations]
    if not rows:
        return []
    count, gbytes, secs = (sum(c["count"] for c in rows), sum(c["bytes"] for c in rows),
                           sum(c["time_s"] for c in rows))
    axes = ", ".join(sorted({a for c in rows for a in c["axes"]}))
    return [ReportWarning(
        "gradient_reduced_per_iteration",
        f"the pipeline loop reduces the stages' gradients over {axes} on each of its {iterations} iterations "
        f"({count} collectives, {gbytes / 1e9:.1f} GB per device per step, {secs:.3g} s of communication in the "
        f"{step_time['estimate_s']:.3g} s estimate): XLA moves such a reduction out of the loop only when each "
        "stage runs one layer. The estimate is this program's; a pipeline that sums its microbatches' gradients "
        "before reducing them (one reduction per step) would spend 1/"
        f"{iterations} of it")]


def check_scan_residuals(remat: str, step_time: Mapping[str, Any]) -> list[ReportWarning]:
    """scan_residuals_traffic: without remat, the traffic of a scan's saved residuals (their stacks written
    layer by layer, zero-filled, read back, copied) takes longer at HBM bandwidth than the math --remat full
    would redo (jaxmem.compiler.residuals): the estimate then expects remat to be faster, and this says which
    buffers' traffic makes it so."""
    res = step_time.get("scan_residuals") if step_time.get("available") else None
    if remat != "none" or not res or res["seconds"] <= res["recompute_s"]:
        return []
    gb = 1e9
    largest = "; ".join(f"{s['shape']} ({s['module'] or 'no module'}) {s['bytes'] / gb:.1f} GB" for s in res["stacks"])
    return [ReportWarning(
        "scan_residuals_traffic",
        f"the scan saves each layer's residuals in stacks whose traffic is {res['bytes'] / gb:.1f} GB per step "
        f"(written {res['written'] / gb:.1f}, zero-filled {res['filled'] / gb:.1f}, read back {res['read'] / gb:.1f}, "
        f"copied {res['copied'] / gb:.1f}), about {res['seconds'] * 1e3:.3g} ms at HBM bandwidth, more than the "
        f"{res['recompute_s'] * 1e3:.3g} ms of GEMMs and attention --remat full would run again: remat is likely "
        f"faster here (and smaller); largest: {largest}")]


def check_precision(precision: str, step_time: Mapping[str, Any]) -> list[ReportWarning]:
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
