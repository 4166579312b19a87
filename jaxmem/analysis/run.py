"""The analysis' entries: a model file, any model the Python API takes, or a Workload, through the
same stages (jaxmem.analysis.stages)."""

from __future__ import annotations

import os
import re
import time

from jaxmem import hf, report, scratch
from jaxmem.analysis import checks, stages
from jaxmem.compiler import cache, targets
from jaxmem.compiler import compiled as compiled_mod
from jaxmem.errors import UserError
from jaxmem.program import layouts, sharding, sizes, step
from jaxmem.program.options import AnalyzeOptions
from jaxmem.program.workload import Workload, load_workload, running_user_code, workload_of


def analyze_file(path: str, opts: AnalyzeOptions, *, prestart: bool = True) -> report.Report:
    """prestart: start the compile's child process before tracing (jaxmem.compiler.early_stop);
    sweep workers say no, every core being busy."""
    t0 = time.perf_counter()
    with scratch.phase("loading the model file"), as_on_target(opts):
        wl = load_workload(path, remat=opts.remat, remat_at=opts.remat_at, **dict(opts.model_args))
        config = hf.info_if_config(path)   # a config.json's model_type and parameter count (report.hf_config)
    return hf.with_config(analyze_workload(wl, opts, source=str(path), t_start=t0, prestart=prestart), config)


def analyze_model(model, opts: AnalyzeOptions, *, prestart: bool = True) -> report.Report:
    """Any model the Python API takes: a model file's path (analyze_file), or a Workload or a function
    returning one (jaxmem.program.workload.workload_of), through the same stages."""
    if isinstance(model, (str, os.PathLike)):
        return analyze_file(os.fspath(model), opts, prestart=prestart)
    t0 = time.perf_counter()
    with as_on_target(opts):
        wl, source = workload_of(model, remat=opts.remat, model_args=dict(opts.model_args), remat_at=opts.remat_at)
    return analyze_workload(wl, opts, source=source, t_start=t0, prestart=prestart)


def admit(model, opts: AnalyzeOptions, workloads: dict | None = None) -> None:
    """Every refusal analyze makes before it traces, made without tracing: the model's arguments (its
    workload()'s signature, its config's limits), the plan's (the layout against the mesh, the batch against
    the data axes, --accum against the batch, the fine-tuning options, a --rules file) and the target's (fp8,
    offloading on the CPU). The same functions, in the same order, as analyze's stages (stages.prepare): the
    explorer's API and jaxmem.explore() ask it of a point before any prediction or compile, so a value analyze
    refuses is refused there with analyze's words. `workloads`: a memo of the loaded workloads by the model's
    arguments (a batch move loads none again: the explorer's)."""
    key = (str(model), opts.model_args, opts.remat, opts.remat_at, opts.gpu, opts.mesh, opts.hosts)
    if workloads is not None and key in workloads:
        wl, source = workloads[key]
    else:
        with as_on_target(opts):
            if isinstance(model, (str, os.PathLike)):
                source = os.fspath(model)
                wl = load_workload(source, remat=opts.remat, remat_at=opts.remat_at, **dict(opts.model_args))
            else:
                wl, source = workload_of(model, remat=opts.remat, model_args=dict(opts.model_args),
                                         remat_at=opts.remat_at)
        if workloads is not None:
            workloads[key] = (wl, source)
    with running_user_code(source):
        stages.plan_and_check(wl.checked(source), opts)


def as_on_target(opts: AnalyzeOptions):
    """The model's workload() runs as on the machine trained on: jax's device queries answer with the
    target's devices (jaxmem.program.sharding.device_queries), made when the model first asks. A
    library's config that records jax.default_backend() when the user's code makes it (EasyDeL's), or a
    mesh built from jax.devices() there, is then the trainer's, as it is while the step is traced."""
    def devices() -> list:
        if targets.resolve_gpu_name(opts.gpu) in ("cpu", "local"):   # jax's own devices are the target's
            return []
        return list(stages.make_target(opts, layouts.parse_mesh(opts.mesh, opts.axis_roles).size).devices)

    return sharding.device_queries(devices)


def analyze_workload(wl: Workload, opts: AnalyzeOptions, source: str = "<workload>", t_start: float | None = None,
                     *, prestart: bool = True) -> report.Report:
    """The stages in turn. The model's code runs again while the step is traced: its stdout and exits
    are guarded; the cache entries this analysis wrote are on disk when it returns."""
    t_start = time.perf_counter() if t_start is None else t_start
    with running_user_code(source), cache.stores_settled():
        try:
            prepared = stages.prepare(wl.checked(source), opts, source, t_start)
            measured = stages.measure(stages.compile_(stages.trace(prepared, prestart=prestart)))
            return stages.report(measured, tuple(checks.run(measured)))
        except UserError:
            raise
        except Exception as e:  # XLA's size limits become a user error; the rest is re-raised
            limit = sizes.compile_limit_error(e)
            if limit is None:
                raise
            raise limit from None


def remat_block(model, opts: AnalyzeOptions) -> str | None:
    """For `compare --remats` and advise's remat changes on a model without a remat hook: a
    --remat-at regex naming the model's repeated block (jaxmem.program.calls.CallLog.repeated_block),
    found by tracing its step once (no compile). None when the model places its own checkpoints,
    names them itself (Workload.remat_at), or has no repeated block. `model`: a model file's path, or
    what the Python API takes besides (a Workload, a function returning one)."""
    with as_on_target(opts):
        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            wl = load_workload(path, remat="none", **dict(opts.model_args))
        else:
            wl, path = workload_of(model, model_args=dict(opts.model_args))
    if wl.remat_hook or wl.remat_at is not None or wl.is_custom_step:
        return None
    mesh_spec = layouts.parse_mesh(opts.mesh, opts.axis_roles)
    with running_user_code(path):
        planned = step.plan(wl.checked(path), opts.step_options(), mesh_spec)
        target = stages.make_target(opts, mesh_spec.size)
        built = step.build(planned, layouts.build_mesh(target.devices, mesh_spec, planned.axis_types))
        compiled_mod.lower(built)
    block = built.calls.repeated_block() if built.calls is not None else None
    return None if block is None else f"^{re.escape(block)}$"
