"""A scan's saved residuals as the step's kernels move them, against what recomputing them would cost.

Without remat, a scanned step's forward loop writes each layer's residuals into stacks of shape
``(layers, ...)`` (an in-place ``dynamic-update-slice``: the slice is written), XLA fills those stacks
with zeros once before the loop (an operand-less broadcast the size of the stack), the backward loop
reads each layer's slice back (a ``dynamic-slice``, fused or bare) and XLA may copy a stack into
another layout (a transpose or copy of the whole stack). ``--remat full`` drops all of that traffic and
runs the forward layer again in the backward loop instead. Both sides are read off the kernels of the
compiled program (jaxmem.compiler.kernels): the stacks' bytes at the achieved HBM bandwidth against the
math remat full redoes, the forward loop body's GEMM and attention kernels at their estimated times (its
element-wise work fuses into the backward's kernels: on benchmarks/outside/nnx_scan_decoder.py --mesh
fsdp=8, --remat full adds 4.8 ms of GEMM and attention time and sheds 21.6 ms of memory-bound kernels,
benchmarks/results/scan-bytes.md).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from jaxmem.compiler import kernels as kernels_mod
from jaxmem.compiler import rates as rates_mod
from jaxmem.xla import hlo_text, opnames

_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _op_name(ins: hlo_text.Instruction) -> str:
    m = _OP_NAME.search(ins.attrs)
    return m.group(1) if m else ""


def _arrays(shape) -> list[hlo_text.Array]:
    if isinstance(shape, hlo_text.Array):
        return [shape]
    return [a for s in shape for a in _arrays(s)]


def _key(a: hlo_text.Array) -> tuple[str, tuple[int, ...]]:
    return a.dtype, a.dims


def _loops(module: hlo_text.Module) -> tuple[list[str], list[str]]:
    """(forward loop bodies, backward loop bodies) of the loops that run more than once."""
    trips = module.trip_counts
    fwd: list[str] = []
    bwd: list[str] = []
    for ins in module.instructions():
        if ins.opcode == "while" and (trips.get(ins.name) or 0) > 1:
            body = dict(ins.called).get("body")
            if body:
                (bwd if opnames.is_backward(_op_name(ins)) else fwd).append(body)
    return fwd, bwd


def _module_of(module: hlo_text.Module, ins: hlo_text.Instruction) -> str:
    """The most specific module a kernel's own or fused instructions name (the update a stack write holds)."""
    names = [_op_name(ins)]
    callee = dict(ins.called).get("calls")
    if callee in module.computations:
        names += [_op_name(i) for i in module.computations[callee].instructions]
    paths = [opnames.module_path(n) for n in names if n]
    return max(paths, key=lambda p: p.count("/"), default="")


def scan_residuals(module: hlo_text.Module, ks: list, perf, r: rates_mod.Rates) -> dict[str, Any] | None:
    """The forward loops' stacks and their traffic per step (None without a forward loop that writes one):
    `bytes` (`written`, `filled`, `read`, `copied`), `seconds` at the achieved HBM bandwidth, `recompute_s`
    (the forward loop bodies' GEMM and attention kernels, which --remat full runs again) and the largest
    `stacks` (shape, the module that made them, their bytes moved)."""
    fwd, bwd = _loops(module)
    if not fwd:
        return None
    by_name = module.by_name
    stacks: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
    recompute = 0.0
    for k in ks:
        if k.computation not in fwd or k.klass == "collective":
            continue
        ins = by_name[k.name]
        if kernels_mod.updates_in_place(module, ins):
            for a in _arrays(ins.shape):
                s = stacks.setdefault(_key(a), {"shape": f"{a.dtype}[{','.join(map(str, a.dims))}]",
                                                "module": _module_of(module, ins), "bytes": 0.0})
                s["bytes"] += k.bytes * k.runs
            continue
        if k.klass in ("gemm", "attention"):
            recompute += rates_mod.kernel_time(k, perf, r) * k.runs
    if not stacks:
        return None
    moved: dict[str, float] = defaultdict(float)
    moved["written"] = sum(s["bytes"] for s in stacks.values())
    for k in ks:
        if k.klass == "collective" or k.computation in fwd:
            continue
        ins = by_name[k.name]
        operands = [by_name[n] for n in ins.operand_names if n in by_name]
        stacked = [o for o in operands if any(_key(a) in stacks for a in _arrays(o.shape))]
        if k.computation == module.entry and not operands:   # the zero fill of a stack before its loop
            for a in _arrays(ins.shape):
                if _key(a) in stacks:
                    moved["filled"] += a.bytes
                    stacks[_key(a)]["bytes"] += a.bytes
        elif k.computation in bwd and stacked:   # a layer's slice read back (or copied out) in the backward loop
            for i, name in enumerate(ins.operand_names):
                o = by_name.get(name)
                if o is not None and isinstance(o.shape, hlo_text.Array) and _key(o.shape) in stacks:
                    got = kernels_mod.operand_traffic(module, ins, i) * k.runs
                    moved["read"] += got
                    stacks[_key(o.shape)]["bytes"] += got
        elif k.computation == module.entry and stacked and k.runs == 1:   # the whole stack copied or transposed
            moved["copied"] += k.bytes
            for o in stacked:
                stacks[_key(_arrays(o.shape)[0])]["bytes"] += k.bytes / len(stacked)
    total = sum(moved.values())
    return {"bytes": total, "written": moved["written"], "filled": moved["filled"], "read": moved["read"],
            "copied": moved["copied"], "seconds": total / r.hbm, "recompute_s": recompute,
            "stacks": sorted(stacks.values(), key=lambda s: -s["bytes"])[:3]}
