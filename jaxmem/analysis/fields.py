"""The Report's fields that are choices and descriptions rather than measurements: the target, the
options as the report names them, a pipelined step's schedule and stages."""

from __future__ import annotations

import os
import re
from typing import Any, cast

from jaxmem import report
from jaxmem.compiler import runtime, schedule, targets
from jaxmem.errors import UserError
from jaxmem.program import step
from jaxmem.program.options import AnalyzeOptions
from jaxmem.program.workload import Workload
from jaxmem.units import fmt_bytes


def target_info(target: targets.Target, devices: int, bud: runtime.Budget, io_bytes: int) -> report.TargetInfo:
    """`io_bytes`: the step's inputs and outputs (an aliased output once), which XLA's limit leaves out."""
    base = targets.compile_base(target)
    slop = schedule.slop_factor(os.environ.get("XLA_FLAGS", "")) if base is not None else None
    limit = None if base is None or slop is None else schedule.limit_from_base(base, io_bytes, slop)
    return report.TargetInfo(gpu=target.gpu, description=target.description, platform=target.platform,
                             devices=devices, hosts=target.hosts, deviceless=target.deviceless,
                             memory_bytes=target.memory_bytes, usable_bytes=bud.usable_bytes, usable_note=bud.note,
                             xla_budget_note=_budget_note(target, bud, base, limit, slop),
                             xla_memory_limit_bytes=limit, xla_memory_base_bytes=base, xla_slop_factor=slop)


def options(opts: AnalyzeOptions, wl: Workload, built: step.BuiltStep, planned: step.StepPlan) -> report.Options:
    """The report's `options`: what the step was built with, as the user would name it (the model file's
    arguments as "arg:<name>" keys, which report.Options cannot name: hence the cast)."""
    return cast(report.Options, {
        "precision": opts.precision, "optimizer": opts.optimizer or _optimizer_name(wl),
        "batch": _global_batch(built), "accum": opts.accum, "remat": opts.remat, "donate": built.donated,
        **_remat_at_options(wl, built),
        **({"moment_dtype": opts.moment_dtype} if opts.moment_dtype else {}),
        **_finetune_options(opts, planned.options.finetune), **_rules_options(opts, planned),
        **({"axis_types": "explicit"} if planned.explicit else {}),
        **{f"arg:{k}": v for k, v in opts.model_args}})


def pipeline_fields(built: step.BuiltStep, planned: step.StepPlan, peak: int, breakdown: dict, ex) -> dict:
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


def _finetune_options(opts: AnalyzeOptions, planned) -> dict:
    """The fine-tuning choices, in `options` when any is made; the frozen base's dtype as compiled
    (`planned`: the step's FineTune, the checkpoint's dtype resolved by finetune.resolve_base)."""
    ft = opts.finetune()
    if not ft.active:
        return {}
    return {"freeze": ft.freeze, "lora_rank": ft.lora_rank, "lora_targets": ft.lora_targets,
            "lora_alpha": ft.lora_alpha, "base_dtype": planned.base_dtype, "offload": ft.offload,
            **({"train_all": True} if ft.train_all else {})}


def context_hint(e: UserError, mesh_spec) -> UserError:
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


def _budget_note(target, bud, base: int | None, limit: int | None, slop: int | None) -> str:
    """Which memory limit XLA's scheduler and rematerialization compiled this step against: the run's
    (benchmarks/results/xla-budget.md: GetSchedulerMemoryLimit's base is the module's device_memory_size, which
    jaxlib sets to the allocator's bytes_limit, total x fraction; without one, 80% of the card)."""
    if base is None or limit is None:
        return ""
    a = getattr(bud, "allocator", None)
    if not target.deviceless:
        whose = "this GPU's allocator limit, as a run here"
    elif a is None or a.kind == "platform":
        whose = (f"80% of the {target.gpu}'s {fmt_bytes(target.memory_bytes)}: under the platform allocator a run's "
                 "compile has no pool limit and budgets 80% of the card, as this one")
    else:
        whose = (f"the run's pool, {a.fraction:g} of the {target.gpu}'s {fmt_bytes(target.memory_bytes)} "
                 f"({'cuda_async release threshold' if a.kind == 'cuda_async' else 'BFC'}: a run's compile is given "
                 "the allocator's limit)")
    return (f"XLA held this step's temporaries to {fmt_bytes(max(limit, 0))}: {fmt_bytes(base)} ({whose}) less the "
            f"step's inputs and outputs, x {slop}% (--xla_gpu_memory_limit_slop_factor); a larger pool or slop "
            "factor lets XLA keep more and recompute less, a smaller one can compile to a smaller peak")


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


def tokens_per_step(built: step.BuiltStep) -> int | None:
    """The tokens a step trains on: batch x sequence of the first integer batch leaf of rank 2 (token
    ids, as every decoder's batch holds them); None for a batch of samples (a float image or feature
    vector, integer labels of rank 1), whose throughput is counted in samples."""
    for leaf in built.leaves:
        if leaf.category == "batch" and len(leaf.shape) == 2 and re.fullmatch(r"u?int\d+", leaf.dtype):
            return leaf.shape[0] * leaf.shape[1]
    return None


def _global_batch(built: step.BuiltStep) -> int | None:
    for leaf in built.leaves:
        if leaf.category == "batch" and leaf.shape:
            return leaf.shape[0]
    return None
