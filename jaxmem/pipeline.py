"""The analysis pipeline: workload + options -> Report."""

from __future__ import annotations

import os
import re
import time
from typing import Any

from jaxmem import report
from jaxmem.compiler import cache, runtime, targets, versions
from jaxmem.compiler import compiled as compiled_mod
from jaxmem.errors import UserError
from jaxmem.program import finetune, layouts, sizes, splits, step, train_state
from jaxmem.program.options import AnalyzeOptions, command_line, offloads_activations  # noqa: F401  (public here too)
from jaxmem.program.tree import x64
from jaxmem.program.workload import Workload, load_workload, running_user_code, workload_of

# Every CPU report says which program it predicts (docs/how-it-works.md, "XLA:CPU's YNNPACK fusions").
CPU_FUSIONS_OFF = (
    "--gpu cpu predicts the step compiled with XLA:CPU's YNNPACK fusions off, as jaxmem compiles it: their run-time "
    "scratch is invisible to XLA's buffer assignment, and a plain jax.jit (fusions on) can peak much higher "
    "(benchmarks/results/accuracy-cpu.md). To run the predicted program in your own training, turn them off: "
    "jax.jit(step, ..., compiler_options={'xla_cpu_experimental_ynn_fusion_type': ''}) or, for the whole process, "
    "XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=")


# XLA:CPU has one memory: "pinned host" and "device" are the same bytes, so an offloaded state
# would be counted on the device and the host at once.
OFFLOAD_ON_CPU = ("--offload optimizer needs a GPU target: the CPU backend has no device memory apart from the "
                  "host's, so nothing moves off the device; pick a GPU (--gpu h100, jaxmem gpus) or drop --offload")


def analyze_file(path: str, opts: AnalyzeOptions, *, prestart: bool = True) -> report.Report:
    """prestart: start the compile's child process before tracing (jaxmem.compiler.early_stop);
    sweep workers say no, every core being busy."""
    from jaxmem import scratch

    t0 = time.perf_counter()
    with scratch.phase("loading the model file"):
        wl = load_workload(path, remat=opts.remat, remat_at=opts.remat_at, **dict(opts.model_args))
    return analyze_workload(wl, opts, source=str(path), t_start=t0, prestart=prestart)


def analyze_model(model, opts: AnalyzeOptions, *, prestart: bool = True) -> report.Report:
    """Any model the Python API takes: a model file's path (analyze_file), or a Workload or a function
    returning one (jaxmem.program.workload.workload_of), through the same pipeline."""
    if isinstance(model, (str, os.PathLike)):
        return analyze_file(os.fspath(model), opts, prestart=prestart)
    t0 = time.perf_counter()
    wl, source = workload_of(model, remat=opts.remat, model_args=dict(opts.model_args), remat_at=opts.remat_at)
    return analyze_workload(wl, opts, source=source, t_start=t0, prestart=prestart)


def analyze_workload(wl: Workload, opts: AnalyzeOptions, source: str = "<workload>", t_start: float | None = None,
                     *, prestart: bool = True) -> report.Report:
    # The model's code runs again while the step is traced: its stdout and exits are guarded.
    with running_user_code(source):
        try:
            return _analyze_workload(wl.checked(source), opts, source, t_start, prestart)
        except UserError:
            raise
        except Exception as e:  # XLA's size limits become a user error; the rest is re-raised
            limit = sizes.compile_limit_error(e)
            if limit is None:
                raise
            raise limit from None
        finally:
            cache.wait_for_stores()   # the entry this analysis wrote is there when it returns


def _parsed_program(text: str | None):
    """The optimized HLO parsed once for both readers of it (the runtime model's communicators and
    the step-time estimate); left as text when it cannot be parsed, so that the estimate says why."""
    if not text:
        return text
    from jaxmem.xla import hlo_text

    try:
        return hlo_text.parse_module(text)
    except Exception:  # noqa: BLE001 -- an unparsable program is left as text: the estimate says why
        return text


def _analyze_workload(wl: Workload, opts: AnalyzeOptions, source: str, t_start: float | None,
                      prestart: bool = True) -> report.Report:
    t_start = time.perf_counter() if t_start is None else t_start
    mesh_spec = layouts.parse_mesh(opts.mesh)
    sizes.check_mesh_devices(mesh_spec.size, cpu=opts.on_cpu)
    planned = step.plan(wl, opts.step_options(), mesh_spec)   # every check, before devices exist
    from jaxmem import scratch

    with scratch.phase("starting jax's backend for the target"):
        target = targets.make_target(opts.gpu, mesh_spec.size, opts.hosts)
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
    # A deviceless GPU compile runs in a child process stopped after buffer assignment; started
    # now (prestart), its jax import overlaps the tracing below (compile_step closes it, used or not).
    from jaxmem.compiler import early_stop

    child = early_stop.Child.start(target, now=prestart) if early_stop.applies(target) else None
    try:
        with scratch.phase("building and tracing the step"):
            mesh = layouts.build_mesh(target.devices, mesh_spec, planned.axis_types)
            built = step.build(planned, mesh)

        sizes.check_leaves(built.leaves, x64=x64())
    except BaseException:
        if child is not None:
            child.close()
        raise
    t_built = time.perf_counter()
    # One compile (or its cached Artifacts); everything below is re-done from them, so a cached
    # answer is processed exactly as a fresh one.
    try:
        art = compiled_mod.compile_step(built, explain=opts.explain, cache=opts.cache, child=child)
    except UserError as e:
        raise _context_hint(e, mesh_spec) from None
    stats = art.stats
    t_compiled = time.perf_counter()
    assignment = art.assignment
    if assignment is None and art.dump is not None:
        from jaxmem.xla.hlo import decode_hlo_proto

        with scratch.phase("reading XLA's buffer assignment"):
            assignment = decode_hlo_proto(art.dump)

    state = train_state.summarize(built.leaves, custom_step=wl.is_custom_step)
    program = _parsed_program(art.hlo_text) if target.platform == "cuda" else art.hlo_text
    # the collectives' device groups size NCCL's communicators (only multi-device GPU programs have any)
    rt = runtime.model(target, program if mesh_spec.size > 1 else None, mesh_spec.axes)
    ex = None
    if assignment is not None:
        from jaxmem.xla import explain

        ex = explain.explain(assignment, [leaf.category for leaf in built.leaves], [leaf.path for leaf in built.leaves],
                             top=opts.top, depth=opts.module_depth, remat=opts.remat,
                             pipeline_iterations=built.schedule.iterations if built.schedule else None)
    t_decoded = time.perf_counter()  # reading the dump + attribution
    # Gradients are XLA temporaries. With the buffer assignment decoded: the gradient buffers
    # live at the peak (XLA may fuse them away or hold bf16 partials). Without it nothing tells
    # how much of XLA's temp is gradients (a small MLP holds 6 KiB of its 2.5 MiB of gradients at
    # the peak: docs/how-it-works.md §8), so all of temp stays activations_and_temporaries, and a
    # note says so, instead of a guessed split.
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
        "generated_code": stats.generated_code,
        "runtime_overhead": rt.in_pool_bytes,
    }
    # Arguments XLA counts that our leaves do not know of (should be none) stay visible.
    unexplained_args = stats.argument - state.arguments
    if unexplained_args:
        breakdown["other_state"] += unexplained_args
    peak = stats.lower_bound + rt.in_pool_bytes
    from jaxmem.compiler import steptime

    step_time = steptime.estimate(program, mesh_axes=mesh_spec.axes, hosts=target.hosts, gpu=target.gpu)
    if built.schedule is not None and step_time.get("available"):
        step_time["pipeline"] = steptime.pipeline_time(step_time, program, iterations=built.schedule.iterations,
                                                       bubble=built.schedule.bubble)

    bud = runtime.budget(target, opts.mem_fraction, rt)
    usable_bytes, usable_note = bud.usable_bytes, bud.note
    fits = None if usable_bytes is None else peak <= usable_bytes and bud.out_of_pool_fits
    headroom = None if usable_bytes is None else usable_bytes - peak

    warnings = [report.ReportWarning("not_donated", f"{n}: params + optimizer state + mutable state are copied, not "
                                     "updated in place; donate them (jax.jit(..., donate_argnums=0))",
                                     stats.output - stats.alias)
                for n in built.notes]
    if not bud.out_of_pool_fits:
        assert target.memory_bytes is not None and bud.out_of_pool_room is not None   # a GPU's pool: both known
        warnings.append(report.ReportWarning(
            "runtime_out_of_pool", f"the runtime needs {rt.out_of_pool_bytes / 2**30:.2f} GiB per device outside JAX's "
            f"pool (CUDA context, {rt.communicators} NCCL communicator(s)) but the pool leaves "
            f"{bud.out_of_pool_room / 2**30:.2f} GiB of the card ({usable_note}): NCCL fails to initialize; use a "
            f"memory fraction of at most "
            f"{max(target.memory_bytes - rt.out_of_pool_bytes, 0) / target.memory_bytes:.2f}",
            rt.out_of_pool_bytes - bud.out_of_pool_room))
    if ex is None and state.gradients:
        warnings.append(report.ReportWarning(
            "gradients_not_split", f"--no-explain: XLA's temporaries ({stats.temp / 2**20:,.2f} MiB) are not split "
                                   "into "
            f"gradients (at most {state.gradients / 2**20:,.2f} MiB, if all were live at once) and activations; all of "
            "them are under activations_and_temporaries. Drop --no-explain to split them."))
    warnings += [report.ReportWarning("xla_remat_failed" if n.startswith("XLA:") else "compile_fallback", n)
                 for n in stats.notes]
    untested = versions.range_warning()
    if untested is not None:
        warnings.append(report.ReportWarning("untested_jax", untested))
    if target.platform == "cpu":
        warnings.append(report.ReportWarning("cpu_fusions_off", CPU_FUSIONS_OFF))
    remat_n = compiled_mod.xla_rematerialized(art.hlo_text) if target.platform == "cuda" else 0
    if remat_n:
        # the step as written, compiled again, only where the answer is near the line (not for a step far over it)
        near = usable_bytes is not None and peak <= 1.25 * usable_bytes
        written = _as_written(built, target, opts.cache) + rt.in_pool_bytes if near else None
        how = ("" if written is None else
               f" The step as written, compiled again with that pass off (XLA_FLAGS=--xla_disable_hlo_passes="
               f"rematerialization): {written / 2**30:,.2f} GiB per device, {(written - peak) / 2**30:+,.2f} GiB.")
        warnings.append(report.ReportWarning(
            "xla_rematerialized", f"XLA recomputed {remat_n} instructions of this step to bring it under its memory "
            f"budget (its rematerialization pass runs when a program exceeds about 80% of the {target.gpu}'s memory): "
            f"the peak is of the program as XLA changed it.{how}", 0 if written is None else max(written - peak, 0)))
    precision_warning = _precision_no_effect(opts.precision, step_time)
    if precision_warning:
        warnings.append(report.ReportWarning("precision_no_effect", precision_warning))
    if opts.remat_at is not None and wl.remat_hook:
        warnings.append(report.ReportWarning(
            "remat_at_ignored", f"--remat-at {opts.remat_at!r} is not applied: this model's workload() takes `remat` "
            f"and places its own checkpoints (--remat {opts.remat} went there)"))
    for issue, moments in sorted(_with_moments(built.issues, built.leaves), key=lambda im: -im[0].replicated_bytes):
        also = f" (so do its {moments} optimizer-state copies: {moments + 1}x the bytes)" if moments else ""
        warnings.append(report.ReportWarning(
            "unsharded_leaf", f"{issue.leaf} {issue.shape} stays replicated on {issue.axis}{also}: {issue.reason}",
            issue.replicated_bytes * (moments + 1)))
    roles = splits.mesh_roles(mesh_spec, built.leaves)
    state_bytes = state.params + state.optimizer_state + state.other_state
    tensor = planned.mesh_spec.model_axis
    tensor_names = tuple(n for n, axes in planned.rules.params if tensor and axes and tensor in axes)
    for message, cost in splits.idle_axes(roles, opts.layout, state_bytes, breakdown["activations_and_temporaries"],
                                          built.logical_names, tensor_names):
        warnings.append(report.ReportWarning("axis_splits_nothing", message, cost))
    guessed = _tensor_by_size(opts.layout, planned.mesh_spec, built)
    if guessed:
        warnings.append(report.ReportWarning("tensor_split_by_size", guessed))
    host = _host(state, stats, warnings, opts.remat)
    if not _host_fits(host, target.gpu, warnings) and fits:
        fits = False

    top: tuple = ()
    modules: tuple = ()
    timeline: tuple = ()
    cats: dict = {}
    peak_index = -1
    if ex is not None:
        top, modules, cats, timeline, peak_index = ex.top, ex.modules, ex.categories, ex.timeline, ex.peak_index
        warnings.extend(ex.warnings)

    return report.Report(
        model=wl.name or "workload",
        source=source,
        target=report.TargetInfo(target.gpu, target.description, target.platform, mesh_spec.size, target.hosts,
                                 target.deviceless, target.memory_bytes, usable_bytes, usable_note,
                                 _budget_note(target)),
        mesh=mesh_spec.axes,
        layout="user" if planned.state_specs is not None else opts.layout,
        options={"precision": opts.precision, "optimizer": opts.optimizer or _optimizer_name(wl),
                 "batch": _global_batch(built), "accum": opts.accum, "remat": opts.remat, "donate": built.donated,
                 **_remat_at_options(wl, built),
                 **_finetune_options(opts), **_rules_options(opts, planned),
                 **({"axis_types": "explicit"} if planned.explicit else {}),
                 **{f"arg:{k}": v for k, v in opts.model_args}},
        per_device_peak_bytes=peak,
        breakdown=breakdown,
        xla={"argument": stats.argument, "output": stats.output, "alias": stats.alias, "temp": stats.temp,
             "generated_code": stats.generated_code, "peak_memory": stats.peak, "lower_bound": stats.lower_bound},
        param_count=state.param_count,
        state_check={"analytic_argument_bytes": state.arguments, "compiled_argument_bytes": stats.argument},
        runtime_overhead_source=rt.summary(),
        runtime=rt.to_json(),
        step_time=step_time,
        trainable_param_count=state.trainable_count,
        frozen_param_count=state.frozen_count,
        trainable_bytes=state.trainable_params,
        frozen_bytes=state.frozen_params,
        trainable=finetune.trainable_report(built.leaves, built.trainable_source),
        host=host,
        mesh_roles=roles,
        shardings=splits.shardings(built.leaves),
        sequence_length=layouts.seq_len([leaf.shape for leaf in built.leaves if leaf.category == "batch"]),
        logical_names=built.logical_names,
        fits=fits,
        headroom_bytes=headroom,
        warnings=tuple(warnings),
        top_buffers=tuple(top),
        modules=tuple(modules),
        peak_categories=cats,
        timeline=tuple(timeline),
        timeline_peak_index=peak_index,
        timings={"build_s": round(t_built - t_start, 3), "lower_s": round(stats.lower_s, 3),
                 "compile_s": round(stats.compile_s, 3), "decode_s": round(t_decoded - t_compiled, 3),
                 "total_s": round(time.perf_counter() - t_start, 3), "cache_hit": float(art.cached)},
        versions=versions.installed(),
        xla_flags=versions.xla_flags(),
        **_pipeline_fields(built, planned, peak, breakdown, ex),
    )


def _pipeline_fields(built: step.BuiltStep, planned: step.StepPlan, peak: int, breakdown: dict, ex) -> dict:
    """The report's `pipeline` and `stages` for a step pipelined over a stage axis ({} otherwise)."""
    sched = built.schedule
    if sched is None:
        return {}
    at_peak = dict(ex.pipeline) if ex is not None else {}
    pipe = {"schedule": sched.kind, "axis": sched.axis, "stages": sched.stages, "microbatches": sched.microbatches,
            "repeats": sched.repeats, "layers": sched.layers, "layers_per_stage": sched.layers // sched.stages,
            "layers_per_repeat": sched.per_chunk, "iterations": sched.iterations, "bubble": sched.bubble,
            "microbatches_in_flight": sched.in_flight(), "stage_remat": sched.checkpointed,
            "chosen": list(planned.notes),
            "program": "one SPMD program for every stage (MaxText's pipeline): each stage runs the same "
                       "compiled step, so each stage's peak is this program's; the embedding and head are "
                       "computed on every stage, their weights sharded as the layout says (not over the stage "
                       "axis)",
            **at_peak}
    stages = tuple({"stage": s, "layers": [rows[0], rows[-1] + 1], "peak_bytes": peak, "breakdown": dict(breakdown),
                    "holds": f"stacked layer rows [{rows[0]}, {rows[-1] + 1}) and the embedding/head shards"}
                   for s in range(sched.stages) for rows in (sched.stage_layers(s),))
    return {"pipeline": pipe, "stages": stages}


def _finetune_options(opts: AnalyzeOptions) -> dict:
    """The fine-tuning choices, in `options` when any is made."""
    ft = opts.finetune()
    if not ft.active:
        return {}
    return {"freeze": ft.freeze, "lora_rank": ft.lora_rank, "lora_targets": ft.lora_targets,
            "lora_alpha": ft.lora_alpha, "base_dtype": ft.base_dtype, "offload": ft.offload}


def _context_hint(e: UserError, mesh_spec) -> UserError:
    """A fused attention kernel whose partitioning rule refuses a split sequence (cuDNN's), under a
    context axis: the error says what to change."""
    ctx = mesh_spec.context_axis
    if ctx is None or mesh_spec.axis_size(ctx) < 2 or "sequence dim" not in str(e):
        return e
    return UserError(f"{str(e).rstrip('.')}. The {ctx} axis splits the sequence, and this attention kernel's "
                     "partitioning rule does not take a split sequence: gather the sequence before it in the model "
                     "(e.g. constrain q, k and v to ('batch', None, 'heads', None)), use an attention written in jnp "
                     f"(llama: --arg attention=xla), or drop the {ctx} axis")


def _rules_options(opts: AnalyzeOptions, planned: step.StepPlan) -> dict:
    """--rules, with the sha256 of the file's content (the content decides the step, not the name)."""
    return {"rules": opts.rules, "rules_sha256": planned.rules_digest} if opts.rules else {}


def _as_written(built, target, cache: bool) -> int:
    """XLA's peak (lower bound) of the step compiled with its rematerialization pass off."""
    from jaxmem.compiler import early_stop

    child = early_stop.Child.start(target) if early_stop.applies(target) else None
    art = compiled_mod.compile_step(built, explain=False, cache=cache, child=child,
                                    extra_options={"xla_disable_hlo_passes": "rematerialization"})
    return art.stats.lower_bound


def _budget_note(target) -> str:
    if target.memory_bytes is None:
        return ""
    return (f"XLA compiled this step for the {target.gpu}'s {target.memory_bytes / 2**30:.2f} GiB: its scheduler and "
            "rematerialization budget about 80% of the card, so the same step can compile to a smaller peak "
            "for a smaller card")


def _tensor_by_size(layout: str, mesh_spec, built) -> str | None:
    """A tp layout on weights that carry no logical names: the tensor axis split each by its largest
    dimension, which is not Megatron's split (heads, mlp columns; rows for the projections back)."""
    tensor = mesh_spec.model_axis
    if layout not in ("tp", "fsdp_tp") or not tensor or mesh_spec.axis_size(tensor) < 2 or built.logical_names:
        return None
    split = [leaf for leaf in built.leaves if leaf.category == "params"
             and any(tensor in (e if isinstance(e, tuple) else (e,)) for e in leaf.spec if e)]
    if not split:
        return None
    big = max(split, key=lambda leaf: leaf.global_bytes)
    dim = next(i for i, e in enumerate(big.spec) if e and tensor in (e if isinstance(e, tuple) else (e,)))
    return (f"{tensor}={mesh_spec.axis_size(tensor)} split {len(split)} weights that carry no logical axis names by "
            f"their largest dimension (e.g. {big.path.split(':', 1)[-1]} {big.shape} on dim {dim}), which need not be "
            "Megatron's split (attention heads, MLP columns, rows for the projections back): this program's memory and "
            "communication may not be a real tensor-parallel run's. Name the weights' axes "
            "(nn.with_logical_partitioning, nnx.Param sharding metadata), or shard them yourself "
            "(Workload(state_specs=...), --rules)")


def _precision_no_effect(precision: str, step_time: dict) -> str | None:
    """--precision bf16/bf16-pure/fp8 whose matmuls still run in fp32: the model fixes its layers'
    dtype (dtype=jnp.float32), so the flag changed the casts, not the dots."""
    if precision not in ("bf16", "bf16-pure", "fp8") or not step_time.get("available"):
        return None
    dots = [p for p in step_time.get("compute_peaks", []) if p["kind"] != "non-dot"]
    total = sum(p["flops"] for p in dots)
    low = sum(p["flops"] for p in dots if p["kind"] in ("bf16", "fp16", "fp8", "int8"))
    if not total or low / total >= 0.5:
        return None
    kinds = ", ".join(f"{p['kind']} {p['flops'] / total:.0%}" for p in sorted(dots, key=lambda p: -p["flops"]))
    return (f"--precision {precision} left {1 - low / total:.0%} of the matmul FLOPs in 32-bit (dots by type: "
            f"{kinds}): "
            "the model's layers fix their own compute dtype (dtype=jnp.float32), so the flag changed only the casts "
            "of the parameters and inputs; set the layers' dtype to change the matmuls")


def remat_block(model, opts: AnalyzeOptions) -> str | None:
    """For `compare --remats` and advise's remat changes on a model without a remat hook: a
    --remat-at regex naming the model's repeated block (jaxmem.program.calls.CallLog.repeated_block),
    found by tracing its step once (no compile). None when the model places its own checkpoints,
    names them itself (Workload.remat_at), or has no repeated block. `model`: a model file's path, or
    what the Python API takes besides (a Workload, a function returning one)."""
    from jaxmem.compiler import targets as targets_mod

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        wl = load_workload(path, remat="none", **dict(opts.model_args))
    else:
        wl, path = workload_of(model, model_args=dict(opts.model_args))
    if wl.remat_hook or wl.remat_at is not None or wl.is_custom_step:
        return None
    mesh_spec = layouts.parse_mesh(opts.mesh)
    with running_user_code(path):
        planned = step.plan(wl.checked(path), opts.step_options(), mesh_spec)
        target = targets_mod.make_target(opts.gpu, mesh_spec.size, opts.hosts)
        built = step.build(planned, layouts.build_mesh(target.devices, mesh_spec, planned.axis_types))
        compiled_mod.lower(built)
    block = built.calls.repeated_block() if built.calls is not None else None
    return None if block is None else f"^{re.escape(block)}$"


def _natural(path: str) -> tuple:
    """Shallow paths first, numbers in order: blocks/2 before blocks/10."""
    return (path.count("/"), [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)])


def _remat_at_options(wl: Workload, built) -> dict[str, Any]:
    """What jaxmem.program.calls placed around the model's calls: the checkpoints of --remat-at (the
    regex and the module paths), and the pmap-style collective axis it bound per device group."""
    log = built.calls
    if log is None:
        return {}
    out: dict[str, Any] = {"collective_axis": log.collective_axis} if log.collective_axis else {}
    if wl.remat_at is not None:
        out |= {"remat_at": wl.remat_at, "remat_placed": sorted(log.placed, key=_natural)}
    return out


def _host(state: train_state.StateBytes, stats, warnings: list, remat: str) -> dict[str, int]:
    """Per-device pinned-host bytes when something is offloaded. XLA's host_argument must be the
    offloaded state's bytes; if XLA kept some of it on the device, say so (the device numbers
    already count it: it is in XLA's device arguments). Under an offloading --remat policy XLA's
    host temporaries are the offloaded activations (the only host buffers the step makes)."""
    offloading = offloads_activations(remat)
    if offloading and not stats.host_temp:
        warnings.append(report.ReportWarning(
            "remat_offloaded_nothing", f"--remat {remat} moved no activation to host memory: the model saves none "
            "that the policy offloads (offload:NAME needs activations named with checkpoint_name inside layers "
            "wrapped in nn.remat/jax.checkpoint with jaxmem.remat_policy(remat); offload_dots needs dots without "
            "batch dimensions there)"))
    if not state.host and not stats.host_temp:
        return {}
    if state.host and stats.host_argument != state.host_arguments:
        warnings.append(report.ReportWarning(
            "offload_not_placed", f"--offload: XLA placed {stats.host_argument:,} bytes of arguments in host memory, "
            f"not the {state.host_arguments:,} offloaded; the device numbers count what stayed on the device",
            max(state.host_arguments - stats.host_argument, 0)))
    return {**state.host, ("activations" if offloading else "temporaries"): stats.host_temp}


def _check_fp8(gpu: str) -> None:
    perf = targets.performance(gpu)
    if perf is None or perf.fp8_flops is None:
        have = ", ".join(k for k, p in targets.PERFORMANCE.items() if p.fp8_flops)
        raise UserError(f"--precision fp8 needs FP8 tensor cores, which {gpu} has not; the catalogue's cards with "
                        f"them: {have} (--gpu NAME). Or use --precision bf16.")


def _host_fits(host: dict[str, int], gpu: str, warnings: list) -> bool:
    """Pinned host memory within the reference system's RAM per GPU (targets.Performance.host_memory)."""
    perf = targets.performance(gpu)
    total = sum(host.values())
    if not total or perf is None or perf.host_memory is None:
        return True
    if total <= perf.host_memory:
        return True
    warnings.append(report.ReportWarning(
        "host_memory_exceeded", f"{total / 2**30:.1f} GiB of pinned host memory per device exceeds the "
        f"{perf.host_memory / 2**30:.0f} GiB per GPU of the reference system's RAM (jaxmem gpus --json: host_memory): "
        "offload less (fewer offloaded names, --remat full) or spread the state over more devices",
        total - perf.host_memory))
    return False


def _with_moments(issues, leaves) -> list[tuple]:
    """Each sharding issue of a parameter with the optimizer-state leaves that mirror it (Adam's mu and
    nu: the same path and shape, sharded as it is): they stay replicated with it."""
    params = {(leaf.path.split(":", 1)[-1], tuple(leaf.shape)) for leaf in leaves if leaf.category == "params"}
    copies: dict[tuple[str, tuple], int] = {}
    for leaf in leaves:
        if leaf.category != "optimizer_state":
            continue
        parts = leaf.path.split(":", 1)[-1].split("/")
        # the longest tail of its path that is a parameter's (optax nests the params' tree under mu/, nu/)
        key = next((k for k in (("/".join(parts[i:]), tuple(leaf.shape)) for i in range(1, len(parts)))
                    if k in params), None)
        if key is not None:
            copies[key] = copies.get(key, 0) + 1
    return [(i, copies.get((i.leaf, tuple(i.shape)), 0)) for i in issues]


def _optimizer_name(wl: Workload) -> str:
    """The optimizer the report names: a custom step's own, by the optax states it carries."""
    if wl.is_custom_step:
        states = sorted(_optax_states(wl.state) - {"EmptyState"})
        return f"step's own ({', '.join(states)})" if states else "step's own (no optimizer state: sgd-like)"
    return "workload's own" if wl.optimizer is not None else "adamw"


def _optax_states(tree, depth: int = 0) -> set[str]:
    """The class names of the optax states (namedtuples named *State) in a custom step's state."""
    if depth > 32:
        return set()
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        name = type(tree).__name__
        out = {name} if name.endswith("State") else set()
        return out | {n for v in tree for n in _optax_states(v, depth + 1)}
    if isinstance(tree, (tuple, list)):
        return {n for v in tree for n in _optax_states(v, depth + 1)}
    if isinstance(tree, dict):
        return {n for v in tree.values() for n in _optax_states(v, depth + 1)}
    fields = getattr(tree, "__dataclass_fields__", None)   # flax TrainState and other dataclasses
    if fields:
        return {n for f in fields for n in _optax_states(getattr(tree, f, None), depth + 1)}
    return set()


def _global_batch(built: step.BuiltStep) -> int | None:
    for leaf in built.leaves:
        if leaf.category == "batch" and leaf.shape:
            return leaf.shape[0]
    return None
