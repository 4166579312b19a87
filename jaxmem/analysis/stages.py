"""The analysis as stages, each a small function from one frozen type to the next (as jax's own
Traced -> Lowered -> Compiled):

    prepare(wl, opts)   -> Prepared   every check that needs no device; the step planned, the target made
    trace(prepared)     -> Traced     the mesh built and the step traced (the compile's child started first)
    compile_(traced)    -> Compiled   one compile, or its cached Artifacts; the buffer assignment decoded
    measure(compiled)   -> Measured   the train state, runtime, breakdown, peak, budget, step time, host bytes
    without_remat(...)  -> Unconstrained|None  the step compiled again at a memory limit where XLA
                                      rematerializes nothing (only when it rematerialized a step near the line)
    report(measured, w) -> Report     the Report's fields, with the checks' warnings (jaxmem.analysis.checks)

Nothing here appends to another stage's values or changes a verdict after it was decided: each
stage reads the one before and returns a new value."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from jaxmem import report as report_mod
from jaxmem import scratch
from jaxmem.analysis import choices as choices_mod
from jaxmem.analysis import fields
from jaxmem.compiler import allocator as alloc_mod
from jaxmem.compiler import compiled as compiled_mod
from jaxmem.compiler import early_stop, runtime, steptime, targets, versions
from jaxmem.compiler.artifacts import Artifacts
from jaxmem.errors import UserError
from jaxmem.program import constants, finetune, layouts, sizes, splits, step, train_state, visible
from jaxmem.program.options import AnalyzeOptions, offloads_activations
from jaxmem.program.tree import x64
from jaxmem.program.workload import Workload
from jaxmem.xla import explain, hlo_text
from jaxmem.xla.hlo import decode_hlo_proto

# XLA:CPU has one memory: "pinned host" and "device" are the same bytes, so an offloaded state
# would be counted on the device and the host at once.
OFFLOAD_ON_CPU = ("--offload optimizer needs a GPU target: the CPU backend has no device memory apart from the "
                  "host's, so nothing moves off the device; pick a GPU (--gpu h100, jaxmem gpus) or drop --offload")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Options checked, the step planned and the target made: nothing traced yet."""

    wl: Workload
    opts: AnalyzeOptions
    source: str
    t_start: float
    mesh_spec: layouts.MeshSpec
    planned: step.StepPlan
    target: targets.Target


@dataclasses.dataclass(frozen=True)
class Traced:
    prepared: Prepared
    built: step.BuiltStep
    child: early_stop.Child | None    # the compile's child process (closed by compile_)
    t_built: float


@dataclasses.dataclass(frozen=True)
class Compiled:
    traced: Traced
    art: Artifacts
    assignment: Any                    # XLA's buffer assignment (jaxmem.xla.buffers), None without a dump
    t_compiled: float


@dataclasses.dataclass(frozen=True)
class Unconstrained:
    """The step compiled again for a device so large that XLA rematerializes nothing (without_remat)."""

    peak: int                          # its peak, with the runtime's in-pool bytes (as Measured.peak)
    step_s: float | None               # its step-time estimate (None: no estimate)
    base_bytes: int                    # what XLA budgeted from in that compile
    instructions: int                  # what XLA still rematerialized there (0 expected)


@dataclasses.dataclass(frozen=True)
class Measured:
    """Everything the checks and the Report read. Shortcuts to the earlier stages' values below."""

    compiled: Compiled
    state: train_state.StateBytes
    program: Any                       # the optimized HLO: parsed where it could be, else its text
    rt: runtime.Runtime
    ex: explain.Explanation | None     # the peak explained (None with --no-explain)
    t_decoded: float
    breakdown: dict[str, int]
    peak: int
    step_time: report_mod.StepTime
    budget: runtime.Budget
    host: dict[str, int]
    verdict: runtime.Verdict           # fits / tight / does_not_fit, with the runtime's ranges
    roles: dict[str, report_mod.MeshRole]
    remat_n: int                       # instructions XLA's rematerialization recomputed
    unconstrained: Unconstrained | None   # the step without XLA's rematerialization (without_remat), when compiled

    # the earlier stages' values, by name
    prepared = property(lambda self: self.compiled.traced.prepared)
    opts = property(lambda self: self.prepared.opts)
    wl = property(lambda self: self.prepared.wl)
    target = property(lambda self: self.prepared.target)
    mesh_spec = property(lambda self: self.prepared.mesh_spec)
    planned = property(lambda self: self.prepared.planned)
    built = property(lambda self: self.compiled.traced.built)
    stats = property(lambda self: self.compiled.art.stats)
    fits = property(lambda self: self.verdict.fits)


def prepare(wl: Workload, opts: AnalyzeOptions, source: str, t_start: float) -> Prepared:
    """Every check that needs no device, the step planned, then the target (jax's backend) made."""
    with scratch.phase("planning the step and starting jax's backend for the target"):
        mesh_spec, planned, target = plan_and_check(wl, opts)
    return Prepared(wl, opts, source, t_start, mesh_spec, planned, target)


def plan_and_check(wl: Workload, opts: AnalyzeOptions) -> tuple[layouts.MeshSpec, Any, targets.Target]:
    """(mesh, plan, target): every refusal analyze makes before it traces, in its order -- the mesh, the plan's
    checks (before devices exist), the target's. analyze's prepare and the explorer's admission (run.admit) both
    run it, so a value one refuses the other refuses in the same words."""
    mesh_spec = layouts.parse_mesh(opts.mesh, opts.axis_roles)
    sizes.check_mesh_devices(mesh_spec.size, cpu=opts.on_cpu)
    planned = step.plan(wl, opts.step_options(), mesh_spec)
    target = make_target(opts, mesh_spec.size)
    _check_target(opts, target)
    return mesh_spec, planned, target


def make_target(opts: AnalyzeOptions, n_devices: int) -> targets.Target:
    """The target of `opts`, its topology telling XLA the memory the run's allocator gives it (a catalogue GPU:
    targets.xla_device_memory), so that XLA's scheduler and rematerialization budget the step as the run's
    compile does. Every place that makes the step's devices makes them here: a mesh the model's own code built
    while its workload() ran must hold the step's devices."""
    named = targets.resolve_gpu_name(opts.gpu)
    run = None if named in ("cpu", "local") else alloc_mod.read(os.environ, opts.allocator, opts.mem_fraction)
    return targets.make_target(opts.gpu, n_devices, opts.hosts, run=run)


def _check_target(opts: AnalyzeOptions, target: targets.Target) -> None:
    """The options a target cannot take: a user error before anything is traced."""
    if opts.offload is not None and target.platform == "cpu":
        raise UserError(OFFLOAD_ON_CPU)
    if opts.precision == "fp8":
        _check_fp8(target.gpu)
    if offloads_activations(opts.remat) and target.platform == "cpu":
        raise UserError(f"--remat {opts.remat} offloads activations to pinned host memory, which needs a GPU target: "
                        "the CPU backend has no device memory apart from the host's; pick a GPU (--gpu h100, jaxmem "
                        "gpus) or another --remat policy")
    if opts.mem_fraction is not None and target.memory_bytes is None:
        raise UserError(f"--mem-fraction {opts.mem_fraction}: --gpu cpu has no fixed device memory to take a share of "
                        "(the OS decides); drop --mem-fraction, or pick a GPU (jaxmem gpus).")


def _check_fp8(gpu: str) -> None:
    perf = targets.performance(gpu)
    if perf is None or perf.fp8_flops is None:
        have = ", ".join(k for k, p in targets.PERFORMANCE.items() if p.fp8_flops)
        raise UserError(f"--precision fp8 needs FP8 tensor cores, which {gpu} has not; the catalogue's cards with "
                        f"them: {have} (--gpu NAME). Or use --precision bf16.")


def trace(p: Prepared, *, prestart: bool = True) -> Traced:
    """The mesh built and the step traced. A deviceless GPU compile runs in a child process stopped
    after buffer assignment; started first (prestart), its jax import overlaps the tracing."""
    child = early_stop.Child.start(p.target, now=prestart) if early_stop.applies(p.target) else None
    try:
        with scratch.phase("building and tracing the step"):
            mesh = layouts.build_mesh(p.target.devices, p.mesh_spec, p.planned.axis_types)
            built = step.build(p.planned, mesh)
        sizes.check_leaves(built.leaves, x64=x64())
    except BaseException:
        if child is not None:
            child.close()
        raise
    return Traced(p, built, child, time.perf_counter())


def compile_(t: Traced) -> Compiled:
    """One compile (or its cached Artifacts); everything after is re-done from them, so a cached
    answer is processed exactly as a fresh one. Closes the child, used or not."""
    opts = t.prepared.opts
    try:
        art = compiled_mod.compile_step(t.built, explain=opts.explain, cache=opts.cache, child=t.child)
    except UserError as e:
        raise fields.context_hint(e, t.prepared.mesh_spec) from None
    t_compiled = time.perf_counter()
    assignment = art.assignment
    if assignment is None and art.dump is not None:
        with scratch.phase("reading XLA's buffer assignment"):
            assignment = decode_hlo_proto(art.dump)
    return Compiled(t, art, assignment, t_compiled)


def _parsed_program(text: str | None):
    """The optimized HLO parsed once for both readers of it (the runtime model's communicators and
    the step-time estimate); left as text when it cannot be parsed, so that the estimate says why."""
    if not text:
        return text
    try:
        return hlo_text.parse_module(text)
    except Exception:  # noqa: BLE001 -- an unparsable program is left as text: the estimate says why
        return text


def _explained(c: Compiled) -> explain.Explanation | None:
    """The peak attributed to the step's leaves and modules, from the buffer assignment."""
    if c.assignment is None:
        return None
    opts, built = c.traced.prepared.opts, c.traced.built
    return explain.explain(c.assignment, [leaf.category for leaf in built.leaves],
                           [leaf.path for leaf in built.leaves], top=opts.top, depth=opts.module_depth,
                           remat=opts.remat,
                           pipeline_iterations=built.schedule.iterations if built.schedule else None)


def _breakdown(state: train_state.StateBytes, stats, ex, rt: runtime.Runtime) -> dict[str, int]:
    """The peak in report.BREAKDOWN_KEYS' parts. Gradients are XLA temporaries: with the buffer
    assignment decoded, the gradient buffers live at the peak (XLA may fuse them away or hold bf16
    partials). Without it nothing tells how much of XLA's temp is gradients (docs/how-it-works.md
    §8), so all of temp stays activations_and_temporaries, and a check says so."""
    gradients = min(ex.categories["gradients"], stats.temp) if ex is not None else 0
    breakdown = {
        "params": state.params,
        "optimizer_state": state.optimizer_state,
        "gradients": gradients,
        "batch": state.batch,
        "other_state": state.other_state - state.fp8_state,
        **({"fp8_state": state.fp8_state} if state.fp8_state else {}),
        "activations_and_temporaries": stats.temp - gradients,
        "outputs_not_aliased": stats.output - stats.alias,
        **({"constants": stats.constant} if stats.constant else {}),
        "generated_code": stats.generated_code,
        "runtime_overhead": rt.in_pool_bytes,
    }
    # Arguments XLA counts that our leaves do not know of (should be none) stay visible.
    breakdown["other_state"] += stats.argument - state.arguments
    return breakdown


def _step_time(program, cost: dict, p: Prepared, built: step.BuiltStep) -> report_mod.StepTime:
    step_time = steptime.estimate(program, mesh_axes=p.mesh_spec.axes, hosts=p.target.hosts, gpu=p.target.gpu,
                                  whole_cost=steptime.whole_cost(cost))   # kept with the text (Artifacts.cost)
    if built.schedule is not None and step_time.get("available"):
        step_time["pipeline"] = steptime.pipeline_time(step_time, program, iterations=built.schedule.iterations,
                                                       bubble=built.schedule.bubble)
    return step_time


def measure(c: Compiled) -> Measured:
    """Every number of the answer, from the compile's Artifacts and the traced step."""
    p, built, stats = c.traced.prepared, c.traced.built, c.art.stats
    target = p.target
    state = train_state.summarize(built.leaves, custom_step=p.wl.is_custom_step)
    program = _parsed_program(c.art.hlo_text) if target.platform == "cuda" else c.art.hlo_text
    # the collectives' device groups size NCCL's communicators (only multi-device GPU programs have any)
    rt = runtime.model(target, program if p.mesh_spec.size > 1 else None, p.mesh_spec.axes)
    ex = _explained(c)
    t_decoded = time.perf_counter()  # reading the dump + attribution
    breakdown = _breakdown(state, stats, ex, rt)
    peak = stats.lower_bound + rt.in_pool_bytes
    bud = runtime.budget(target, p.opts.mem_fraction, rt, allocator=p.opts.allocator)
    host = train_state.host_bytes(state, stats.host_temp, p.opts.remat)
    verdict = runtime.judge(bud, stats.lower_bound, rt)   # fits / tight / does_not_fit, over the runtime's ranges
    if verdict.fits and not targets.host_fits(host, target.gpu):
        verdict = verdict.does_not_fit()   # pinned host memory over the system's RAM
    remat_n = compiled_mod.xla_rematerialized(c.art.hlo_text) if target.platform == "cuda" else 0
    free = without_remat(c.traced, peak, bud.usable_bytes, rt.in_pool_bytes) if remat_n else None
    step_time = _step_time(program, c.art.cost, p, built)
    return Measured(c, state, program, rt, ex, t_decoded, breakdown, peak, step_time, bud, host, verdict,
                    splits.mesh_roles(p.mesh_spec, built.leaves), remat_n, free)


# The device memory the compile without XLA's rematerialization is told: this many times the larger of the card
# and the step's peak, so that XLA's limit (80% of it, less the inputs and outputs) is far above what the step
# needs unchanged.
UNCONSTRAINED_SCALE = 4


def without_remat(t: Traced, peak: int, usable: int | None, in_pool: int) -> Unconstrained | None:
    """The step compiled again for a device where XLA's limit is far above the step (UNCONSTRAINED_SCALE): its
    peak (with the runtime's in-pool bytes) and step time without XLA's rematerialization, and without the
    scheduler holding back for memory -- what a larger limit would buy. One more compile, only where XLA
    rematerialized and the answer is near the line (not for a step far over it); None otherwise, and where the
    memory XLA compiles for cannot be set (an attached GPU's compile takes its allocator's limit; a jax whose
    compile cannot run in jaxmem's child)."""
    target = t.prepared.target
    if usable is None or peak > 1.25 * usable or not early_stop.applies(target) or target.memory_bytes is None:
        return None
    memory = UNCONSTRAINED_SCALE * max(target.memory_bytes, peak)
    child = early_stop.Child.start(target, device_memory=memory)
    try:
        art = compiled_mod.compile_step(t.built, explain=False, cache=t.prepared.opts.cache, child=child,
                                        whole=False)
    except early_stop.Unsupported:
        return None
    st = _step_time(_parsed_program(art.hlo_text), art.cost, t.prepared, t.built)
    return Unconstrained(art.stats.lower_bound + in_pool, st.get("estimate_s") if st.get("available") else None,
                         targets.xla_base(memory), compiled_mod.xla_rematerialized(art.hlo_text))


def _xla_remat(m: Measured) -> dict[str, Any]:
    """The report's xla_remat: what XLA recomputed and the step without it ({} where it recomputed nothing)."""
    if not m.remat_n:
        return {}
    free = m.unconstrained
    return {"instructions": m.remat_n, **dict(m.step_time.get("xla_remat") or {}),
            "unconstrained_peak_bytes": free.peak if free else None,
            "unconstrained_step_s": free.step_s if free else None,
            "unconstrained_xla_memory_base_bytes": free.base_bytes if free else None,
            "unconstrained_instructions": free.instructions if free else None}


def report(m: Measured, warnings: tuple[report_mod.ReportWarning, ...]) -> report_mod.Report:
    """The Report: every field from the stages, and the warnings (jaxmem.analysis.checks.run(m))."""
    p, built, stats, ex = m.prepared, m.built, m.stats, m.ex
    usable = m.budget.usable_bytes
    band = runtime.band(m.budget, stats.lower_bound, m.rt)   # the memory fractions the step fits at
    seq = layouts.seq_len([leaf.shape for leaf in built.leaves if leaf.category == "batch"])
    return report_mod.Report(
        model=p.wl.name or "workload",
        source=p.source,
        target=fields.target_info(p.target, p.mesh_spec.size, m.budget, stats.argument + stats.output - stats.alias),
        mesh=p.mesh_spec.axes,
        layout="user" if p.planned.state_specs is not None else p.opts.layout,
        options=fields.options(p.opts, p.wl, built, p.planned),
        per_device_peak_bytes=m.peak,
        breakdown=m.breakdown,
        xla={"argument": stats.argument, "output": stats.output, "alias": stats.alias, "temp": stats.temp,
             "generated_code": stats.generated_code, "peak_memory": stats.peak, "lower_bound": stats.lower_bound},
        param_count=m.state.param_count,
        state_check={"analytic_argument_bytes": m.state.arguments, "compiled_argument_bytes": stats.argument},
        runtime_overhead_source=m.rt.summary(),
        runtime=m.rt.to_json(),
        step_time=m.step_time,
        trainable_param_count=m.state.trainable_count,
        frozen_param_count=m.state.frozen_count,
        trainable_bytes=m.state.trainable_params,
        frozen_bytes=m.state.frozen_params,
        host=m.host,
        mesh_roles=m.roles,
        activation_constraints=built.constraints or {},
        constants=constants.rows(built.captured, _kept_constants(m.compiled)),
        trainable=finetune.trainable_report(built.leaves, built.trainable_source),
        choices=choices_mod.choices(opts=p.opts, wl=p.wl, target=p.target, budget=m.budget,
                                    hlo_text=m.compiled.art.hlo_text, seq_len=seq, mesh_spec=p.mesh_spec,
                                    planned=p.planned, leaves=built.leaves, built=built),
        state_leaves=tuple(visible.state_leaves(built.leaves)),
        shardings=splits.shardings(built.leaves),
        sequence_length=seq,
        tokens_per_step=fields.tokens_per_step(built),
        logical_names=built.logical_names,
        fits=m.fits,
        headroom_bytes=None if usable is None else usable - m.peak,
        fraction_floor=band[0],
        fraction_ceiling=band[1],
        xla_remat=_xla_remat(m),
        warnings=warnings,
        top_buffers=tuple(ex.top) if ex is not None else (),
        modules=tuple(ex.modules) if ex is not None else (),
        peak_categories=ex.categories if ex is not None else {},
        timeline=tuple(ex.timeline) if ex is not None else (),
        timeline_peak_index=ex.peak_index if ex is not None else -1,
        timeline_phases=ex.phases if ex is not None else (),
        timings=_timings(m),
        versions=versions.installed(),
        xla_flags={**versions.xla_flags(), "compile_options": list(m.stats.compile_options)},
        verdict=m.verdict.verdict, margin_bytes=m.verdict.margin_bytes, verdict_terms=m.verdict.terms,
        **fields.pipeline_fields(built, p.planned, m.peak, m.breakdown, ex),
    )


def _kept_constants(c: Compiled) -> list[int] | None:
    """The bytes of each constant XLA keeps in device memory (its constant allocations); None without
    the buffer assignment (--no-explain)."""
    if c.assignment is None:
        return None
    sizes: dict[int, int] = {}
    for b in c.assignment.buffers:
        if b.is_constant and not b.is_thread_local:
            sizes[b.allocation] = max(sizes.get(b.allocation, 0), b.size)
    return list(sizes.values())


def _timings(m: Measured) -> report_mod.Timings:
    c = m.compiled
    t_start, stats = m.prepared.t_start, m.stats
    return {"build_s": round(c.traced.t_built - t_start, 3), "lower_s": round(stats.lower_s, 3),
            "compile_s": round(stats.compile_s, 3), "decode_s": round(m.t_decoded - c.t_compiled, 3),
            "total_s": round(time.perf_counter() - t_start, 3), "cache_hit": float(c.art.cached)}
