"""Lower and compile a built step for its target; our own record of XLA's numbers."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile
import time

import jax

from jaxmem.errors import UserError
from jaxmem.program.step import BuiltStep


@dataclasses.dataclass(frozen=True)
class CompiledStats:
    """XLA's per-device memory numbers for one compiled program (bytes)."""

    argument: int
    output: int
    alias: int
    temp: int
    generated_code: int
    peak: int            # XLA's own peak_memory_in_bytes (0 when the backend gives none)
    host_temp: int
    lower_s: float
    compile_s: float
    notes: tuple[str, ...] = ()   # how the compile deviated from the default pipeline

    @property
    def lower_bound(self) -> int:
        """XLA's device-memory lower bound: code + args + outputs - aliased + temp."""
        return self.generated_code + self.argument + self.output - self.alias + self.temp


# XLA:CPU's YNNPACK fusions (dots, reductions) allocate their intermediates at run time, outside
# XLA's buffer assignment: `jaxmem verify` measured +16 MiB per device for one attention-score
# fusion, 2-9% of a small Llama step. CPU compiles turn them off, so that XLA's numbers cover every
# buffer (the same option reaches `jaxmem verify`'s measured run: it compiles through here too).
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def lower_and_compile(built: BuiltStep, dump_dir: str | None = None):
    """Returns (compiled, CompiledStats). `dump_dir` asks XLA for its buffer assignment."""
    jitted = jax.jit(built.fn, donate_argnums=built.donate_argnums, keep_unused=True,
                     out_shardings=built.out_shardings)
    t0 = time.perf_counter()
    try:
        with built.trace_context():
            lowered = jitted.lower(*built.args)
    except Exception as e:
        raise UserError(_explain_trace_error(e)) from None
    t1 = time.perf_counter()
    options = {}
    if dump_dir is not None:
        from jaxmem.xla import buffers

        options = buffers.compile_options(dump_dir)
    if built.mesh is not None and built.mesh.devices.flat[0].platform == "cpu":
        options = {**options, **CPU_COMPILER_OPTIONS}
    notes: list[str] = []
    try:
        with _xla_log(notes):
            compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    except Exception as e:
        msg = str(e)
        if "RESOURCE_EXHAUSTED" in msg or "Out of memory" in msg:
            raise UserError(f"XLA could not fit the program at compile time: {msg.splitlines()[0]}") from None
        if "output tile sizes" not in msg:
            raise
        # Without a GPU, XLA cannot autotune and its Triton GEMM emitter finds no tiling for
        # some dot shapes; a real compile would fall back to cuBLAS, so we do the same.
        notes.append(f"Triton GEMM tiling failed devicelessly ({msg.splitlines()[0][:160]}); "
                     "compiled with xla_gpu_enable_triton_gemm=false (cuBLAS GEMMs), as autotuning would fall back")
        if dump_dir is not None:
            import shutil

            shutil.rmtree(dump_dir, ignore_errors=True)
        with _xla_log(notes):
            compiled = lowered.compile(compiler_options={**options, "xla_gpu_enable_triton_gemm": False})
    t2 = time.perf_counter()
    m = compiled.memory_analysis()
    if m is None:
        raise UserError("this backend reports no memory analysis for compiled programs")
    stats = CompiledStats(
        argument=int(m.argument_size_in_bytes), output=int(m.output_size_in_bytes), alias=int(m.alias_size_in_bytes),
        temp=int(m.temp_size_in_bytes), generated_code=int(m.generated_code_size_in_bytes),
        peak=int(getattr(m, "peak_memory_in_bytes", 0) or 0), host_temp=int(m.host_temp_size_in_bytes),
        lower_s=t1 - t0, compile_s=t2 - t1, notes=tuple(notes),
    )
    return compiled, stats


@contextlib.contextmanager
def _xla_log(notes: list[str]):
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
            for line in log.read().decode(errors="replace").splitlines():
                m = re.search(r"hlo_rematerialization\.cc:\d+\] (Can't reduce memory use.*)", line)
                if m:
                    notes.append(f"XLA: {m.group(1)}")


def _explain_trace_error(e: Exception) -> str:
    """One line for errors raised while tracing the user's model or loss."""
    msg = str(e).strip()
    first = msg.splitlines()[0] if msg else type(e).__name__
    m = re.search(r"unbound axis name: (\w+)", msg)
    if m:
        return (f"the model uses the collective axis {m.group(1)!r} (e.g. BatchNorm(axis_name=...)), written for pmap; "
                "jaxmem runs the step under jit with global arrays, where cross-device statistics are automatic. "
                f"Drop axis_name={m.group(1)!r} from the model for the analysis.")
    m = re.search(r"One of .* was given the sharding of .*|divisible", msg)
    if m:
        return f"a sharding does not divide a dimension: {first}"
    return f"tracing the training step failed: {type(e).__name__}: {first}"
