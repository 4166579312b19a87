"""The report's warnings: one table of checks, run in this order (the order a report lists them).

Each check is a small function in the module that owns its concern (the runtime's memory in
jaxmem/compiler/runtime.py, a leaf's sharding in jaxmem/program/sharding.py, ...); it returns a
list of jaxmem.report.ReportWarning (empty when all is well) and changes nothing. The table below
adapts each to the analysis' Measured value (jaxmem.analysis.stages), in one line.

To add a check (one line here, one entry in jaxmem.report.WARNING_KINDS):

    1. in the owning module:  def check_thing(a, b) -> list[ReportWarning]: ...
    2. in jaxmem.report.WARNING_KINDS:  "thing_kind": "what it means",   (and a line in docs/analyze.md)
    3. here, where its warnings should appear in the report:
           Check(("thing_kind",), lambda m: owner.check_thing(m.opts.thing, m.stats.temp)),

`m` has every stage's values: m.opts, m.wl, m.target, m.mesh_spec, m.planned, m.built, m.stats, m.state,
m.rt, m.ex, m.breakdown, m.peak, m.step_time, m.budget, m.host, m.verdict (m.fits), m.roles (see Measured).
A check's kinds are named in the table so that tests can tell every kind has a producer.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from jaxmem import hf
from jaxmem.analysis.stages import Measured
from jaxmem.compiler import compiled, runtime, schedule, steptime, targets, versions
from jaxmem.program import finetune, layouts, sharding, splits, step, train_state, visible, workload
from jaxmem.report import ReportWarning
from jaxmem.xla import explain, gathered


@dataclasses.dataclass(frozen=True)
class Check:
    kinds: tuple[str, ...]                                 # the warning kinds it can produce
    run: Callable[[Measured], list[ReportWarning]]


def _tensor_names(m: Measured) -> tuple[str, ...]:
    """The parameters a rule puts on the tensor axis (idle_axes names them when it splits nothing)."""
    tensor = m.planned.mesh_spec.model_axis
    return tuple(n for n, axes in m.planned.rules.params if tensor and axes and tensor in axes)


def _xla_flags() -> str:
    """XLA_FLAGS as the compile read them (the compile cache keys on them, so a cached answer agrees)."""
    return os.environ.get("XLA_FLAGS", "")


def _batch_replicated(m: Measured) -> list[ReportWarning]:
    """The model's constraints that keep a batch-sized dimension whole (visible.check_batch_replicated)."""
    return visible.check_batch_replicated(m.built.constraints, [leaf for leaf in m.built.leaves
                                                                if leaf.category == "batch"],
                                          m.planned.mesh_spec, m.opts.accum, m.built.names_used)


def _model_kind(m: Measured) -> str:
    """How the model is written, for advice that fits it: "step" (a custom step's own JAX code), "decoder" (a
    config.json decoder jaxmem builds), "nnx" or "linen"."""
    if m.wl.is_custom_step:
        return "step"
    return "decoder" if isinstance(m.wl.model, hf.Decoder) else "nnx" if step.is_nnx(m.wl) else "linen"


def _io(m: Measured) -> int:
    """The step's inputs and outputs on the device, an aliased output counted once (XLA's scheduler limit)."""
    return m.stats.argument + m.stats.output - m.stats.alias


def _seq_len(m: Measured) -> int | None:
    """The batch's sequence length, as the report's sequence_length reads it."""
    return layouts.seq_len([leaf.shape for leaf in m.built.leaves if leaf.category == "batch"])


CHECKS: tuple[Check, ...] = (
    Check(("not_donated",), lambda m: step.check_donation(m.built, m.stats.output - m.stats.alias)),
    Check(("runtime_out_of_pool", "verdict_tight", "allocator_above_threshold"),
          lambda m: runtime.verdict_warnings(m.target, m.rt, m.budget, m.verdict)),
    Check(("gradients_not_split",), lambda m: explain.check_gradients_split(m.ex is not None, m.stats.temp,
                                                                           m.state.gradients)),
    Check(("xla_remat_failed", "compile_fallback"), lambda m: compiled.check_compile(m.stats)),
    Check(("untested_jax",), lambda m: versions.check_range()),
    Check(("cpu_fusions_off",), lambda m: targets.check_cpu_fusions(m.target)),
    Check(("xla_rematerialized",), lambda m: compiled.check_rematerialized(
        m.remat_n, m.peak, m.unconstrained.peak if m.unconstrained else None, targets.compile_base(m.target))),
    Check(("precision_no_effect",), lambda m: steptime.check_precision(m.opts.precision, m.step_time)),
    Check(("scan_residuals_traffic",), lambda m: steptime.check_scan_residuals(m.opts.remat, m.step_time)),
    Check(("gradient_reduced_per_iteration",), lambda m: steptime.check_pipeline_reductions(m.step_time, m.roles)),
    Check(("schedule_memory_limited",), lambda m: schedule.check_memory_limited_schedule(
        m.step_time, m.stats.temp, _io(m), targets.compile_base(m.target), _xla_flags(),
        schedule.scheduler_ran(m.target.gpu, _xla_flags()))),
    Check(("collectives_not_overlapped",), lambda m: schedule.check_collectives_not_overlapped(
        m.step_time, schedule.scheduler_ran(m.target.gpu, _xla_flags()))),
    Check(("remat_at_ignored",), lambda m: workload.check_remat_at(m.wl, m.opts.remat_at, m.opts.remat)),
    Check(("lora_skipped",), lambda m: finetune.check_lora_skipped(m.built.lora_skipped)),
    Check(("unsharded_leaf",), lambda m: sharding.check_unsharded(m.built.issues, m.built.leaves)),
    Check(("fallback_poor_dimension",), lambda m: visible.check_poor_splits(m.built.issues, m.built.leaves)),
    Check(("batch_replicated",), lambda m: _batch_replicated(m)),
    Check(("axis_splits_nothing",), lambda m: splits.check_idle_axes(
        m.roles, m.opts.layout, m.state.params + m.state.optimizer_state + m.state.other_state,
        m.breakdown["activations_and_temporaries"], m.built.logical_names, _tensor_names(m))),
    Check(("tensor_split_by_size",), lambda m: splits.check_tensor_by_size(m.opts.layout, m.planned.mesh_spec,
                                                                          m.built.leaves, m.built.logical_names)),
    Check(("remat_offloaded_nothing",), lambda m: train_state.check_remat_offload(m.opts.remat, m.stats.host_temp)),
    Check(("offload_not_placed",), lambda m: train_state.check_offload_placed(m.state, m.stats.host_argument)),
    Check(("host_memory_exceeded",), lambda m: targets.check_host_memory(m.host, m.target.gpu)),
    Check(("gathered_params_live",), lambda m: gathered.check_gathered_params(
        m.ex.gathered_params, m.ex.peak_bytes, model=_model_kind(m), scanned=m.ex.scanned) if m.ex else []),
    Check(("remat_saves_too_much",), lambda m: list(m.ex.warnings) if m.ex else []),
    Check(("past_context",), lambda m: hf.check_context(m.wl.model, _seq_len(m))),
)


def run(m: Measured) -> list[ReportWarning]:
    """Every check's warnings, in the table's order."""
    return [w for check in CHECKS for w in check.run(m)]
