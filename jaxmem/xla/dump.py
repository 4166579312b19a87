"""Asking XLA to dump the optimized module with its buffer assignment, and finding that dump."""

from __future__ import annotations

import os
import re

from jaxmem.xla.buffers import BufferAssignment
from jaxmem.xla.hlo import decode_hlo_proto


def compile_options(dump_dir: str | os.PathLike) -> dict:
    """The ``compiler_options`` that make XLA write the optimized module with its buffer
    assignment (``*after_optimizations.hlo.pb``) into ``dump_dir``, and as little else as it can.

    Protos only: every other dump format, per-pass / per-pipeline / per-emitter dumps and large
    constants are switched off here, overriding any ``XLA_FLAGS`` that turn them on (with
    ``--xla_dump_hlo_pass_re=.*`` in the environment a small step dumps 126 files without these
    overrides, 31 with). What no option removes: XLA:GPU writes the LLVM IR (before and after
    optimization) and PTX of every kernel module whenever a module is dumped at all
    (``DumpIrIfEnabled`` and the PTX dump check only that dumping is on for the module), plus a
    few small config / thunk files. For a scanned 8B-parameter Llama step on 8 x H100 that is
    323 files, 4.3 MB, about 0.3-0.4 s of CPU time on a 3.5-4 s compile.
    """
    return {
        "xla_dump_to": os.fspath(dump_dir),
        "xla_dump_hlo_module_re": ".*",
        "xla_dump_hlo_as_proto": True,
        "xla_dump_hlo_as_text": False,
        "xla_dump_hlo_as_long_text": False,
        "xla_dump_hlo_as_dot": False,
        "xla_dump_hlo_as_html": False,
        "xla_dump_hlo_as_url": False,
        "xla_dump_fusion_visualization": False,
        "xla_dump_hlo_snapshots": False,
        "xla_dump_large_constants": False,
        "xla_dump_module_metadata": False,
        "xla_dump_hlo_pass_re": "",
        "xla_dump_hlo_pipeline_re": "",
        "xla_dump_emitter_re": "",
        "xla_dump_disable_metadata": False,    # op_name metadata is what names the buffers
    }


def read_dump(dump_dir: str | os.PathLike, module_name_hint: str | None = None) -> BufferAssignment:
    """Decode the after-optimizations HloProto that a compile with :func:`compile_options`
    wrote into ``dump_dir``."""
    return decode_hlo_proto(read_dump_bytes(dump_dir, module_name_hint))


def read_dump_bytes(dump_dir: str | os.PathLike, module_name_hint: str | None = None) -> bytes:
    """The serialized after-optimizations HloProto that a compile with :func:`compile_options`
    wrote into ``dump_dir`` (decode it with :func:`jaxmem.xla.hlo.decode_hlo_proto`).

    When the directory holds several modules, the one whose name contains
    ``module_name_hint`` is taken, else the last ``jit_*`` module by XLA's module number (the
    jitted function; JAX compiles no helper after it in the same call).
    """
    dump_dir = os.fspath(dump_dir)
    names = [n for n in os.listdir(dump_dir)
             if n.endswith(".hlo.pb") and "after_optimizations" in n]
    if not names:
        raise FileNotFoundError(
            f"no '*after_optimizations*.hlo.pb' in {dump_dir}: was the program compiled with "
            "jaxmem.xla.dump.compile_options(dump_dir)?")
    if module_name_hint:
        hinted = [n for n in names if module_name_hint in n]
        if not hinted:
            raise FileNotFoundError(f"no dumped module matches {module_name_hint!r} in {dump_dir}: {sorted(names)}")
        names = hinted
    jitted = [n for n in names if ".jit_" in n or n.startswith("jit_")]
    pick = sorted(jitted or names, key=_module_number)[-1]
    with open(os.path.join(dump_dir, pick), "rb") as f:
        return f.read()


def _module_number(name: str) -> tuple[int, str]:
    m = re.match(r"module_(\d+)", name)
    return (int(m.group(1)) if m else -1, name)

