"""Lower and compile a built step for its target; our own record of XLA's numbers."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
import time

import jax
import jaxlib
from jax._src import compilation_cache as jax_cc
from jax._src import config as jax_config
from jax.sharding import AxisType

from jaxmem import scratch
from jaxmem.compiler import cache as cache_mod
from jaxmem.compiler import early_stop, versions
from jaxmem.compiler.artifacts import Artifacts, CompiledStats
from jaxmem.compiler.partitioners import rule_failure
from jaxmem.errors import UserError, cap, trace_error
from jaxmem.program import constants, sharding, sizes
from jaxmem.program.step import BuiltStep
from jaxmem.report import ReportWarning
from jaxmem.xla import dump, memory_stats
from jaxmem.xla.hlo import decode_hlo_proto

# XLA:CPU's YNNPACK fusions (dots, reductions) allocate their intermediates at run time, outside
# XLA's buffer assignment: `jaxmem verify` measured +16 MiB per device for one attention-score
# fusion, 2-9% of a small Llama step. CPU compiles turn them off, so that XLA's numbers cover every
# buffer (the same option reaches `jaxmem verify`'s measured run: it compiles through here too).
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def lower_and_compile(built: BuiltStep, dump_dir: str | None = None):
    """Returns (compiled, CompiledStats). `dump_dir` asks XLA for its buffer assignment.

    The executable is compiled with the default pipeline (`jaxmem verify` runs it); analyses go
    through :func:`compile_step`, which may skip backend work and reuse cached answers.
    """
    lowered, lower_s = lower(built)
    options = _base_options(built)
    if dump_dir is not None:
        options = {**dump.compile_options(dump_dir), **options}
    compiled, stats = _compile(lowered, options, dump_dir, lower_s)
    return compiled, stats


def lower(built: BuiltStep):
    """Trace and lower the step: (jax Lowered, seconds). Errors in the user's code are UserErrors."""
    jitted = jax.jit(built.fn, donate_argnums=built.donate_argnums, keep_unused=True,
                     out_shardings=built.out_shardings)
    t0 = time.perf_counter()
    try:
        with built.trace_context():
            traced = jitted.trace(*built.args)
            lowered = traced.lower()
    except UserError:  # raised by the model's checked loss/step (Workload.checked): already names the culprit
        raise
    except Exception as e:  # noqa: BLE001 -- any failure to trace is the model's, explained as a user error
        changed = "; ".join(built.changed)   # what jaxmem changed in the model's program: the likely cause
        raise UserError(trace_error(e, explicit=_explicit(built.mesh))
                        + (f" [jaxmem changed the model's program before this error: {changed}]" if changed else "")) \
            from None

    built.constraints = sharding.model_constraints(traced.jaxpr)   # what the model constrained itself
    built.captured = constants.captured(traced.jaxpr)   # the tables it closed over, before the arrays go
    sizes.check_dots(sharding.equations(traced.jaxpr))   # a matmul XLA cannot shape: refused before compiling
    if built.calls is not None:
        built.calls.check()   # what the trace found (a --remat-at that placed nothing), before any compile
    return lowered, time.perf_counter() - t0


def _explicit(mesh) -> bool:
    """The mesh's axes are Explicit (--axis-types explicit)."""

    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", None) or ())


def _base_options(built: BuiltStep) -> dict:
    if built.mesh is not None and built.mesh.devices.flat[0].platform == "cpu":
        return dict(CPU_COMPILER_OPTIONS)
    return {}


@contextlib.contextmanager
def no_persistent_cache():
    """JAX's persistent compilation cache off (JAX_COMPILATION_CACHE_DIR, jax_compilation_cache_dir):
    an executable it returns was not compiled by this run, so XLA wrote no buffer assignment to
    explain (a second `--gpu cpu` run failed on it), and the compile-only capture saw no compile.
    jaxmem has its own cache, keyed by what decides the answer."""

    state = getattr(jax_config, "enable_compilation_cache", None)
    if state is None or not jax_cc.is_persistent_cache_enabled():
        yield
        return
    # jax decides once per process whether the cache is used (compilation_cache.is_cache_used):
    # that decision is reset under the switch, and again after, for the caller's own compiles
    with state(False):
        jax_cc.reset_cache()
        try:
            yield
        finally:
            jax_cc.reset_cache()


def _compile(lowered, options: dict, dump_dir: str | None, lower_s: float):
    t1 = time.perf_counter()
    notes: list[str] = []
    failures: list[str] = []   # XLA's rematerialization falling short (its log)
    while True:
        try:
            with _xla_log(failures), no_persistent_cache():
                compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
            break
        except Exception as e:
            msg = str(e)
            _raise_compile_error(msg)
            retry = _fallback(options, msg)
            if retry is None:
                raise
            options, note = retry
            notes.append(note)
            if dump_dir is not None:   # the next compile's dump alone
                shutil.rmtree(dump_dir, ignore_errors=True)
                os.makedirs(dump_dir, exist_ok=True)
    t2 = time.perf_counter()
    m = compiled.memory_analysis()
    if m is None:
        raise UserError("this backend reports no memory analysis for compiled programs")
    stats = CompiledStats(
        argument=int(m.argument_size_in_bytes), output=int(m.output_size_in_bytes), alias=int(m.alias_size_in_bytes),
        temp=int(m.temp_size_in_bytes), generated_code=int(m.generated_code_size_in_bytes),
        peak=int(getattr(m, "peak_memory_in_bytes", 0) or 0), host_temp=int(m.host_temp_size_in_bytes),
        lower_s=lower_s, compile_s=t2 - t1, notes=tuple(notes), remat_failures=tuple(failures),
        host_argument=int(m.host_argument_size_in_bytes), host_output=int(m.host_output_size_in_bytes),
        host_alias=int(m.host_alias_size_in_bytes), compile_options=_named(options),
    )
    return compiled, stats


def _named(options: dict) -> tuple[str, ...]:
    """The XLA options jaxmem gave a compile, as `name=value` (the report's xla_flags.compile_options);
    the dump's own options (where XLA writes its buffer assignment) are left out: they only add files."""
    return tuple(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items()
                 if not k.startswith("xla_dump"))


# XLA's own refusal: an absl status with its code (`INTERNAL: No supported config found for HLO ...`)
_XLA_STATUS = re.compile(r"\b(INTERNAL|INVALID_ARGUMENT|UNIMPLEMENTED|FAILED_PRECONDITION|NOT_FOUND|UNKNOWN): ")

# How a compile XLA refused is retried (the note each retry leaves in the report)
_SPEED_NOTE = ("XLA refused the compile with jaxmem's speed option(s) {} ({}); compiled again without them "
               "(the default backend pipeline: the same buffers, a slower compile)")


def _fallback(options: dict, msg: str) -> tuple[dict, str] | None:
    """(the options to compile with instead, the note saying so) after XLA refused a compile with
    `options` saying `msg`; None when nothing jaxmem chose can be the cause (the error is then raised).
    Each retry removes or pins one thing, so the retries end."""
    if _triton_tiling_failed(msg) and options.get("xla_gpu_enable_triton_gemm") is not False:
        return {**options, "xla_gpu_enable_triton_gemm": False}, _TRITON_NOTE.format(msg.splitlines()[0][:160])
    speed = [k for k in options if k in FAST_GPU_OPTIONS]
    # an option jaxmem added for speed must never cost the answer (a jaxlib it breaks a compile on); only
    # XLA's own refusal is retried, not a child killed by a signal nor a Python error
    if speed and _XLA_STATUS.search(msg):
        return ({k: v for k, v in options.items() if k not in speed},
                _SPEED_NOTE.format(", ".join(_named({k: options[k] for k in speed})), msg.splitlines()[0][:160]))
    return None


# Without a GPU, XLA cannot autotune and its Triton GEMM emitter finds no tiling for some dot
# shapes; a real compile would fall back to cuBLAS, so we do the same.
_TRITON_NOTE = ("Triton GEMM tiling failed devicelessly ({}); compiled with xla_gpu_enable_triton_gemm=false "
                "(cuBLAS GEMMs), as autotuning would fall back")


# How XLA:GPU's Triton GEMM emitter says it found no tiling: jaxlib 0.10 on, and jaxlib 0.9's words
_TRITON_TILING = ("output tile sizes", "Too small divisible part of the contracting dimension",
                  "Failed to compute symbolic tile")


def _triton_tiling_failed(msg: str) -> bool:
    return any(words in msg for words in _TRITON_TILING)


def _raise_compile_error(msg: str) -> None:
    """XLA's errors that the user's program causes, as UserErrors."""
    rule = rule_failure(msg)
    if rule is not None:   # the model's own custom_partitioning rule raised while XLA asked it
        raise UserError("a custom partitioning rule of the model failed while XLA partitioned the step: "
                        f"{rule}") from None
    if "HostOffloadOutputLocationMismatch" in msg:   # jaxlib 0.9's XLA: state returned to host memory

        raise UserError(f"this XLA (jaxlib {jaxlib.__version__}) cannot compile a step that "
                        "returns its state to pinned host memory (XLA error E1200, "
                        "HostOffloadOutputLocationMismatch); jax 0.10 or newer compiles it: upgrade jax and jaxlib, "
                        "or drop --offload optimizer") from None
    if "RESOURCE_EXHAUSTED" in msg or "Out of memory" in msg:
        raise UserError(f"XLA could not fit the program at compile time: {cap(msg)}") from None


# XLA:GPU options that skip backend work the memory answer does not need. Buffer assignment is
# done before any of it runs (it is the last HLO-level step; LLVM IR emission and PTX/cubin
# compilation follow), so these cannot change it; tests/test_compiled.py compiles shipped models
# with and without them and asserts identical XLA numbers and identical buffer lists.
# Measured effect: docs/how-it-works.md, "Faster compiles".
FAST_GPU_OPTIONS = {
    "xla_backend_optimization_level": 0,           # LLVM -O0 on the emitted kernels
    "xla_llvm_disable_expensive_passes": True,     # skip LLVM's expensive IR passes
    "xla_gpu_disable_gpuasm_optimizations": True,  # ptxas -O0
}
# One before buffer assignment. XLA:GPU's `config-assigner` pass (jaxlib 0.12; the autotuner, renamed)
# gives each fusion a kernel config; devicelessly it cannot time candidates, so it compiles each
# generic (non-GEMM) fusion's candidates, LLVM and ptxas included, until one compiles: 141 fusions
# and 47 of the 51 s of HLO passes of README command 1 on a loaded machine (docs/how-it-works.md,
# "Where the time goes at jax 0.12"). A generic fusion's kernel config is its code, not its HLO:
# the buffers are byte-identical without it (tests/test_compiled.py, tests/test_goldens.py). GEMM
# fusions keep their config search: it picks cuBLAS / Triton and split-k, which do change buffers.
# Set only on the jaxlibs where that test proves it (versions.FUSION_AUTOTUNER_OFF_PROVEN); and should
# XLA refuse a compile with any of these options, the step is compiled again without them (_SPEED_NOTE).
if versions.fusion_autotuner_off_proven():
    FAST_GPU_OPTIONS["xla_gpu_experimental_enable_fusion_autotuner"] = False


def _gpu(built: BuiltStep) -> bool:
    platform = built.mesh.devices.flat[0].platform if built.mesh is not None else jax.default_backend()
    return platform in ("cuda", "gpu")


# jaxlib 0.9 (jaxmem.compiler.versions.gpu_peak_is_static): without the dump, XLA's peak is all there is
_STATIC_PEAK_NOTE = ("jaxlib {}'s memory_analysis() leaves the temporaries out of a GPU executable's "
                     "peak_memory_in_bytes: xla.peak_memory is the static memory alone (the reported peak, XLA's "
                     "lower bound, is not affected; without --no-explain it is XLA's peak from the dump)")


def fast_gpu_options(flags: str | None = None) -> dict:
    """FAST_GPU_OPTIONS less those the user's XLA_FLAGS (or `flags`) set: a compile option overrides
    XLA_FLAGS, and a flag the user sets must win (it is reported as passed to the compile)."""
    text = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    named = set(re.findall(r"--(xla_\w+)", text))
    return {k: v for k, v in FAST_GPU_OPTIONS.items() if k not in named}


def compile_options(built: BuiltStep, *, fast: bool = True) -> dict:
    """The compiler options compile_step uses for `built` (without the dump options)."""
    options = _base_options(built)
    if fast and _gpu(built):
        options = {**options, **fast_gpu_options()}
    return options


def compile_step(built: BuiltStep, *, explain: bool, cache: bool = True, fast: bool = True,
                 child=None, extra_options: dict | None = None, whole: bool = True) -> Artifacts:
    """Lower and compile `built` for its target: the Artifacts an analysis needs.

    explain: also capture XLA's buffer assignment (a dump of the optimized module).
    cache: answer from the on-disk compile cache (jaxmem.compiler.cache), keyed by the lowered
    program, the target, the compile options and the versions. Lowering always runs (it is the
    key); the compile is what a hit saves. Either way the fresh compile is stored: --no-cache
    replaces the entry it would have read (a way to refresh one).
    fast: skip XLA:GPU backend work that cannot change the buffer assignment (FAST_GPU_OPTIONS).
    extra_options: XLA options on top of those (a compile of the step with a pass off).
    child: a started :class:`jaxmem.compiler.early_stop.Child` for this target: the compile runs
    there and stops after buffer assignment (every number is read from XLA's dump). The child is
    closed on return, used or not. The child's target config is the compile's (its memory size is XLA's
    budget): with `whole` False, a jax that cannot stop early raises early_stop.Unsupported rather than
    compile whole for the mesh's devices (a compile for another memory size than theirs).
    """
    fallback: list[str] = []   # what this jax lacked, and what was done instead (notes of the report)
    try:
        with scratch.phase("lowering the step"):
            lowered, lower_s = lower(built)
        options = {**compile_options(built, fast=fast), **(extra_options or {})}
        until = "buffer_assignment" if child is not None else "executable"
        keys = cache_mod.keys(lowered, built, options, explain=explain, until=until,
                              target_config=child.args[0] if child is not None else None)
        art = _from_cache(keys, explain, lower_s) if cache else None
        if art is not None:
            return art
        if child is not None:
            try:
                with scratch.phase("compiling the step (XLA, in a child process)"):
                    art = _compile_early(child, lowered, options, lower_s)
            except early_stop.Unsupported as e:   # this jax lacks what the early stop needs: compile whole
                if not whole:
                    raise
                fallback.append(f"{e}; the step was compiled whole instead (slower; the same numbers)")
            else:
                # the dump is always there: stored so that it answers with and without explain
                cache_mod.store_in_background(keys[0], art.to_json())
                return art if explain else dataclasses.replace(art, dump=None, assignment=None)
    finally:
        if child is not None:
            child.close()   # idempotent: a child that compiled has already stopped
    art = _compile_whole(built, lowered, options, lower_s, explain=explain, fallback=fallback)
    cache_mod.store(keys[-1], art.to_json())
    return art


def _from_cache(keys: list[str], explain: bool, lower_s: float) -> Artifacts | None:
    """The first of `keys` the cache holds, as this run's Artifacts (it lowered, and compiled nothing)."""
    for k in keys:
        # an entry that is not this key's own, whole, well-formed answer is a miss (cache.load)
        art = cache_mod.load(k, parse=lambda d: Artifacts.from_json(d, cached=True))
        if art is not None:
            return dataclasses.replace(art, dump=art.dump if explain else None,
                                       stats=dataclasses.replace(art.stats, lower_s=lower_s, compile_s=0.0))
    return None


def _compile_whole(built: BuiltStep, lowered, options: dict, lower_s: float, *, explain: bool,
                   fallback: list[str]) -> Artifacts:
    """A whole compile in this process (its dump read when explaining); `fallback`: the notes of
    what was done instead of the default, to which this adds its own."""
    dump_dir = tempfile.mkdtemp(prefix="jaxmem-") if explain else None
    try:
        # nothing between the dump folder and the phase: a signal once the folder exists names the compile
        full = options if dump_dir is None else {**dump.compile_options(dump_dir), **options}
        with scratch.phase("compiling the step (XLA)"):
            compiled, stats = _compile(lowered, full, dump_dir, lower_s)
        raw = _read_dump(dump_dir, fallback) if dump_dir is not None else None
        if raw is not None and not (_gpu(built) and stats.generated_code > 0):   # a GPU executable's code holds them
            stats = dataclasses.replace(stats, constant=_constant_bytes(raw))
        assignment, stats = _static_peak(built, raw, stats, fallback)
        if fallback:
            stats = dataclasses.replace(stats, notes=(*stats.notes, *fallback))
    finally:
        if dump_dir is not None:
            shutil.rmtree(dump_dir, ignore_errors=True)
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0] if cost else None
    cost = {str(k): float(v) for k, v in (cost or {}).items()}
    return Artifacts(stats=stats, cost=cost, hlo_text=compiled.as_text() or "", dump=raw, assignment=assignment)


def _constant_bytes(raw: bytes) -> int:
    try:
        return memory_stats.constant_bytes(raw)
    except ValueError:   # a dump _static_peak cannot read either: it says so
        return 0


def _read_dump(dump_dir: str, fallback: list[str]) -> bytes | None:
    try:
        return dump.read_dump_bytes(dump_dir)
    except (OSError, ValueError) as e:   # this XLA dumped nothing we can read: XLA's totals only
        fallback.append(f"no buffer assignment could be read from XLA's dump ({e}): the peak and its parts "
                        "are memory_analysis() numbers, without the buffers that make them")
        return None


def _static_peak(built: BuiltStep, raw: bytes | None, stats: CompiledStats, fallback: list[str]):
    """(the decoded assignment or None, stats): a jaxlib whose GPU peak leaves the temporaries out
    gets XLA's own peak from the dump, replayed; without a dump, a note says the peak is static."""
    if not (_gpu(built) and versions.gpu_peak_is_static()):
        return None, stats
    if raw is None:
        fallback.append(_STATIC_PEAK_NOTE.format(jaxlib.__version__))
        return None, stats

    assignment = decode_hlo_proto(raw)
    return assignment, dataclasses.replace(stats, peak=assignment.xla_peak)


def _compile_early(child, lowered, options: dict, lower_s: float) -> Artifacts:
    """The Artifacts of a compile stopped after buffer assignment (jaxmem.compiler.early_stop)."""
    t0 = time.perf_counter()
    notes: list[str] = []
    compiler = child
    while True:
        try:
            with no_persistent_cache():
                raw, log = early_stop.compile_until_buffer_assignment(compiler, lowered, options)
            break
        except early_stop.CompileFailed as e:
            _raise_compile_error(str(e))
            retry = _fallback(options, str(e))
            if retry is None:
                raise RuntimeError(str(e)) from None
            options, note = retry
            notes.append(note)
            if compiler is not child:
                compiler.close()
            compiler = early_stop.Child(*child.args)   # a child compiles one step: a fresh one for the retry
    try:
        # read while the child prints the module (early_stop.Child.printed)
        failures = _notes_from_log(log)
        m = memory_stats.from_hlo_proto(raw)
        assignment = decode_hlo_proto(raw)
        text, cost = compiler.printed(raw)
    finally:
        compiler.close()
    stats = CompiledStats(
        argument=m["argument"], output=m["output"], alias=m["alias"], temp=m["temp"],
        generated_code=0,   # what a compile-only executable reports: no code is loaded
        constant=memory_stats.constant_bytes(raw),   # which XLA:GPU would count in generated_code
        peak=assignment.xla_peak, host_temp=m["host_temp"],
        lower_s=lower_s, compile_s=time.perf_counter() - t0, notes=tuple(notes), remat_failures=tuple(failures),
        host_argument=m["host_argument"], host_output=m["host_output"], host_alias=m["host_alias"],
        compile_options=_named(options),
    )
    # the deviceless compile-only executable has no cost analysis either: the step-time estimate
    # reads the optimized HLO itself, and XLA's cost of the module the text was printed from is kept
    # with it, so that an answer from the cache costs what the fresh one did (some XLA versions print
    # text their own parser refuses as it is: jaxmem.compiler.versions.hlo_module_from_text)

    return Artifacts(stats=stats, cost=cost, hlo_text=text, dump=raw,
                     assignment=assignment)


@contextlib.contextmanager
def _xla_log(failures: list[str]):
    """Capture XLA's C++ log lines (written to fd 2) during a compile.

    The one worth keeping becomes a note: XLA:GPU's rematerialization failing to bring
    the program under its memory limit (about 80% of the card) -- the program will not
    fit, and XLA says by how much. The rest is noise for a report.
    """
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (embedded use): nothing to capture
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            failures += _notes_from_log(log.read().decode(errors="replace"))


def _notes_from_log(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        m = re.search(r"hlo_rematerialization\.cc:\d+\] (Can't reduce memory use.*)", line)
        if m:
            out.append(f"XLA: {m.group(1)}")
    return out


def xla_rematerialized(hlo_text: str | None) -> int:
    """Instructions XLA's rematerialization pass recomputed in the optimized program (it names its
    clones ``<name>.remat``, ``.remat2``, ...). The pass changes a program only when the program as
    written exceeds XLA's memory budget for the card."""
    return len(set(re.findall(r"%([\w.\-]+?\.remat\d*)\b", hlo_text or "")))


def check_compile(stats: CompiledStats) -> list[ReportWarning]:
    """xla_remat_failed: XLA:GPU's rematerialization fell short of its memory limit (XLA's log);
    compile_fallback: how the compile deviated from the default pipeline."""
    return ([ReportWarning("xla_remat_failed", n) for n in stats.remat_failures]
            + [ReportWarning("compile_fallback", n) for n in stats.notes])


def check_rematerialized(remat_n: int, peak: int, unconstrained: int | None,
                         base: int | None) -> list[ReportWarning]:
    """xla_rematerialized: XLA recomputed `remat_n` instructions to stay under its limit (`base`: what it
    budgeted from, the run's pool); `unconstrained` is the peak of the step compiled again at a limit where
    XLA recomputes nothing (jaxmem.analysis.stages.without_remat), None when not compiled (far over the line,
    where the answer does not hinge on it)."""
    if not remat_n:
        return []
    limit = "" if base is None else f" (it budgets from {base / 2**30:,.2f} GiB, the run's pool)"
    how = ("" if unconstrained is None else
           f" The step without it, compiled again for a device where XLA's limit is far above the step: "
           f"{unconstrained / 2**30:,.2f} GiB per device, {(unconstrained - peak) / 2**30:+,.2f} GiB (report's "
           "xla_remat: its step time, what a larger memory fraction or --xla_gpu_memory_limit_slop_factor buys).")
    return [ReportWarning(
        "xla_rematerialized", f"XLA recomputed {remat_n} instructions of this step to bring it under its memory "
        f"limit{limit}: the peak is of the program as XLA changed it.{how}",
        0 if unconstrained is None else max(unconstrained - peak, 0))]
