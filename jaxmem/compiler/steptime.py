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
from jaxmem.compiler import targets, versions
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
    rows = communication_rows(colls, perf, rates_mod.rates(gpu, perf), dph)
    alone_s = unoverlapped_collective_seconds(module, colls, ks, perf, rates_mod.rates(gpu, perf), dph)
    bytes_moved = kernels_mod.bytes_per_step(ks)
    classes = _kernel_classes(ks, colls, busy)
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
        # busy seconds of the collectives XLA scheduled with no kernel beside them (synchronous, or a start
        # right before its done): nothing can hide them
        "unoverlapped_collective_s": alone_s,
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


def unoverlapped_collective_seconds(module: hlo_text.Module, colls: list[Collective], ks: list, perf, r,
                                    devices_per_host: int) -> float:
    """Busy seconds per step of the collectives XLA scheduled with nothing to hide behind: synchronous ones,
    and async ones with no kernel or loop between their ``*-start`` and ``*-done`` (without a latency-hiding
    schedule XLA converts collectives to async pairs and leaves each done right after its start)."""
    kernels = {(k.computation, k.name) for k in ks if k.klass != "collective"}
    alone: set[tuple[str, str]] = set()
    for cname, comp in module.computations.items():
        open_starts: dict[str, bool] = {}          # start -> whether compute was scheduled since
        for ins in comp.instructions:
            key = (cname, ins.name)
            if ins.opcode.endswith("-start") and ins.opcode != "fusion-start":
                open_starts[ins.name] = False
            elif ins.opcode.endswith("-done"):
                ops = re.findall(r"%([\w.\-]+)", ins.operands)
                if ops and ops[0] in open_starts and not open_starts.pop(ops[0]):
                    alone.add((cname, ops[0]))
            elif key in kernels or ins.opcode in ("while", "conditional", "call"):
                open_starts = dict.fromkeys(open_starts, True)
        alone.update((cname, i.name) for i in comp.instructions if i.opcode in _SYNC_COLLECTIVES)
    return sum((rates_mod.collective_time(c, perf, r, devices_per_host, r.nvls)[0] * c.count_in_loop for c in colls
                if (c.computation, c.name) in alone), 0.0)


_SYNC_COLLECTIVES = frozenset({"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
                               "ragged-all-to-all", "collective-broadcast"})


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


# XLA:GPU's latency-hiding scheduler holds each step to a memory limit (openxla xla/service/gpu/
# gpu_hlo_schedule.cc, GetSchedulerMemoryLimit): 80% of the device's memory less the step's inputs and
# outputs (an aliased output counted once), times --xla_gpu_memory_limit_slop_factor / 100 (default 95,
# xla/debug_options_flags.cc). A step whose temporaries exceed it gets no collective started early where
# that would hold more memory: its communication runs beside no compute.
SCHEDULER_MEMORY_SHARE = 0.80
DEFAULT_SLOP_FACTOR = 95


def slop_factor(xla_flags: str) -> int:
    """--xla_gpu_memory_limit_slop_factor as XLA_FLAGS sets it (the last one wins), else XLA's default."""
    found = re.findall(r"--xla_gpu_memory_limit_slop_factor=(\d+)", xla_flags or "")
    return int(found[-1]) if found else DEFAULT_SLOP_FACTOR


def scheduler_memory_limit(memory_bytes: int, io_bytes: int, slop: int = DEFAULT_SLOP_FACTOR) -> int:
    """The bytes XLA's GPU scheduler allows a step's temporaries on a card of `memory_bytes`."""
    return int((SCHEDULER_MEMORY_SHARE * memory_bytes - io_bytes) * slop / 100)


LHS_FLAG = "--xla_gpu_enable_latency_hiding_scheduler=true"
# The compute capabilities whose deviceless compile overlaps collectives without LHS_FLAG. Measured, not read
# from XLA (its flag defaults to false, debug_options_flags.cc): the tiny Llama at --mesh fsdp=4 --batch 8,
# jax 0.9.0, 0.10.2 and 0.12, hides its collectives on h100, h100-pcie, h200 (9.0), b200 and gb200 (10.0) and
# leaves every one alone on a100-80g (8.0), a10g and rtx-3090 (8.6), rtx-4090 and l40s (8.9), rtx-5090 (12.0).
LHS_BY_DEFAULT_MAJOR = frozenset({9, 10})


def lhs_by_default(gpu: str) -> bool:
    """Whether XLA overlaps collectives on this catalogue target without LHS_FLAG (True off the catalogue:
    no claim is made there)."""
    spec = targets.CATALOGUE.get(gpu)
    return spec is None or spec.compute_capability[0] in LHS_BY_DEFAULT_MAJOR


def check_collectives_not_overlapped(step_time: Mapping[str, Any], temp: int, io_bytes: int,
                                     memory_bytes: int | None, xla_flags: str,
                                     lhs_default: bool = True) -> list[ReportWarning]:
    """collectives_not_overlapped: at least 10% of the estimate is communication beside no compute, 90% of the
    collectives' time is in ones XLA scheduled with no kernel beside them, the step is under XLA's scheduler
    memory limit (over it, schedule_memory_limited says why, on a target whose compile runs the scheduler
    by itself: `lhs_default`) and XLA_FLAGS does not turn XLA's latency-hiding scheduler on (LHS_BY_DEFAULT_MAJOR:
    where XLA runs it unasked)."""
    if not memory_bytes or not step_time.get("available") or "unoverlapped_collective_s" not in step_time:
        return []
    exposed, step, busy = (step_time["exposed_communication_s"], step_time["estimate_s"],
                           step_time["communication_s"])
    sync = step_time["unoverlapped_collective_s"]
    if exposed < 0.1 * step or not busy or sync < 0.9 * busy or LHS_FLAG in (xla_flags or "").split():
        return []
    if lhs_default and temp > scheduler_memory_limit(memory_bytes, io_bytes, slop_factor(xla_flags)):
        return []       # the scheduler ran, held back by memory: schedule_memory_limited's case
    return [ReportWarning(
        "collectives_not_overlapped",
        f"XLA scheduled {sync / busy:.0%} of the step's collective time with no kernel beside it, so {exposed:.3g} s "
        f"of the {step:.3g} s estimate is communication beside no compute. Its latency-hiding scheduler, which "
        "overlaps collectives with compute, runs only where XLA turns it on (measured at jax 0.9-0.12: on for the "
        "H100, H200, B200 and GB200 targets, off for the A100, the Ampere and Ada cards and the RTX 5090); set "
        f"XLA_FLAGS={LHS_FLAG}, as the public GPU "
        "recipes do, and analyze again to see the step with its collectives overlapped")]


def check_memory_limited_schedule(step_time: Mapping[str, Any], temp: int, io_bytes: int,
                                  memory_bytes: int | None, xla_flags: str,
                                  pool_bytes: int | None = None, lhs_default: bool = True) -> list[ReportWarning]:
    """schedule_memory_limited: the step's temporaries exceed XLA's scheduler memory limit and at least
    10% of the estimate is collectives with no kernel beside them: the step time is of that schedule,
    slower than the same collectives hidden once the step is under the limit. `pool_bytes`: JAX's pool on
    the card, which a run compiles against instead of the deviceless 80% (jaxlib py_client.cc,
    set_device_memory_size). Not where the scheduler did not run at all (no LHS_FLAG on a target that needs
    it: collectives_not_overlapped's case)."""
    if not memory_bytes or not step_time.get("available") or "unoverlapped_collective_s" not in step_time:
        return []
    if not lhs_default and LHS_FLAG not in (xla_flags or "").split():
        return []
    slop = slop_factor(xla_flags)
    limit = scheduler_memory_limit(memory_bytes, io_bytes, slop)
    exposed, step = step_time["exposed_communication_s"], step_time["estimate_s"]
    if temp <= limit or step_time["unoverlapped_collective_s"] < 0.1 * step:
        return []
    run = ""
    if pool_bytes:
        run_limit = int((pool_bytes - io_bytes) * slop / 100)
        run = (f" A JAX run on the card compiles against its memory pool ({pool_bytes / 2**30:,.2f} GiB) instead: "
               f"a limit of {max(run_limit, 0) / 2**30:,.2f} GiB, "
               + ("which holds these temporaries, so there XLA can overlap more and the step can be faster than "
                  "this estimate." if run_limit >= temp else "which they exceed too."))
    return [ReportWarning(
        "schedule_memory_limited",
        f"the step's temporaries ({temp / 2**30:,.2f} GiB per device) exceed the memory XLA's scheduler allowed "
        f"them in this compile ({max(limit, 0) / 2**30:,.2f} GiB: {SCHEDULER_MEMORY_SHARE:.0%} of the card's "
        f"{memory_bytes / 2**30:,.2f} GiB less the step's inputs and outputs, {io_bytes / 2**30:,.2f} GiB, "
        f"x {slop}% (--xla_gpu_memory_limit_slop_factor)), so it held back collectives that would have needed "
        f"more memory: {exposed:.3g} s of the {step:.3g} s estimate is communication beside no compute.{run} The "
        "step time is of this schedule; a change that brings the temporaries under the limit (remat, more "
        "sharding, a smaller batch) lets the same collectives hide behind compute, so compare step times among "
        "layouts under it")]
