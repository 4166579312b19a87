"""The kernels a compiled step launches, each with the HBM bytes it really moves and its FLOPs.

XLA's ``HloCostAnalysis`` charges an instruction every byte of its operands and result. Inside a
scanned model that is wrong by the trip count: each iteration's ``dynamic-update-slice`` into a
stacked ``(layers, ...)`` residual buffer, and each ``dynamic-slice`` reading one layer's weights
out of the stacked parameters, would move the whole stack, so the bytes grow with the square of the
layer count. XLA's GPU emitters do not: an in-place update writes its update, a slice reads its
slice (XLA's own GPU cost model, ``GpuHloCostAnalysis``, counts fusion operands by how much of them
is read for the same reason). Here, per kernel of the optimized, scheduled program:

* a fusion (or a ``fusion-start``: XLA's async dynamic-slice fusions) reads each operand once,
  except an operand it only slices (``dynamic-slice`` / ``slice`` / ``gather`` of it inside the
  fusion: the slices' bytes) and the buffer a root ``dynamic-update-slice`` or ``scatter`` updates
  in place (aliased: not read; the update is written, not the buffer); it writes its results, the
  in-place ones as their updates;
* a bare ``dynamic-update-slice`` reads and writes its update; a bare ``dynamic-slice`` / ``slice``
  reads and writes its result; a ``copy`` (XLA already elided the ones it could) reads and writes
  its result;
* bitcasts, tuples, ``get-tuple-element``, parameters, constants, control flow (``while``,
  ``conditional``, ``call``) and async ``*-done`` halves launch nothing and move nothing;
* collectives are costed on their links (:mod:`jaxmem.compiler.steptime`), copies to and from
  pinned host memory over PCIe (``steptime.host_transfer_bytes``), not here;
* a kernel in a loop body runs once per trip (``Module.multiplicity``); the condition of a loop with a
  known trip count launches nothing (XLA:GPU's WhileThunk runs the body that many times).

The kernel classes the step-time model rates differently: ``gemm`` (cuBLAS / cuBLASLt custom calls,
Triton GEMM fusions, any fusion holding a dot), ``attention`` (cuDNN fused attention), ``memory``
(every other fusion and unfused op: element-wise, reductions, copies, slices), ``collective``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from functools import cached_property

from jaxmem.compiler import dots as dots_mod
from jaxmem.xla import hlo_text

# launch nothing, move nothing (their bytes are other instructions' buffers)
_FREE = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
    "after-all", "partition-id", "replica-id", "opt-barrier", "optimization-barrier", "add-dependency",
    "domain", "fusion-done", "async-done", "copy-done", "all-gather-done", "all-reduce-done",
    "collective-permute-done", "reduce-scatter-done", "send-done", "recv-done", "get-dimension-size",
    "all-to-all-done", "ragged-all-to-all-done", "collective-broadcast-done",
    "iota",   # XLA folds iotas into their users' fusions; a bare one is cheap
})
COLLECTIVE_OPS = frozenset({
    "all-gather", "all-gather-start", "all-reduce", "all-reduce-start", "reduce-scatter", "reduce-scatter-start",
    "all-to-all", "all-to-all-start", "ragged-all-to-all", "ragged-all-to-all-start", "collective-permute",
    "collective-permute-start", "collective-broadcast", "collective-broadcast-start",
    "send", "recv",
})
_HOST = frozenset({"copy-start"})   # host offload copies: steptime.host_transfer_bytes
_SLICERS = frozenset({"dynamic-slice", "slice", "gather"})
_PASS = frozenset({"bitcast", "reshape", "get-tuple-element"})   # views of a parameter, not reads
# the integer element types a quantized base stores its codes in (qwix: int8 -> s8, int4 -> s4, NF4 -> u4 codes
# into a 16-entry table); read by a fusion that writes floats, they are a dequantization
QUANTIZED_CODES = frozenset({"s8", "u8", "s4", "u4"})
_FLOATS = frozenset({"bf16", "f16", "f32"})


def _arrays(shape) -> list:
    """The arrays of an HLO shape (an Array or a nested tuple of them)."""
    if isinstance(shape, hlo_text.Array):
        return [shape]
    return [a for s in (shape or ()) for a in _arrays(s)]


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One launch site of the step: an instruction of a computation that runs `runs` times a step."""

    name: str
    computation: str
    opcode: str
    klass: str              # gemm | attention | memory | collective
    runs: int               # executions per step (the enclosing loops' trip counts)
    bytes: float            # HBM bytes one execution moves (read + written)
    flops: float = 0.0      # dot / attention FLOPs of one execution (0 for memory-bound kernels)
    dot_kind: tuple[str, int] | None = None     # (kind, passes): steptime.dot_kind of its dots
    gemm_dims: tuple[int, int, int, int] | None = None   # (batch, m, n, k) of its largest dot
    backward: bool = False  # attention: the backward kernel
    # bytes it reads from integer arrays while writing floats: a quantized base's weights (qwix's int8 / int4 /
    # NF4 codes) turned back into the compute dtype, alone or as a GEMM's prologue (step_time.dequantization)
    dequantized_bytes: int = 0


def _operand_names(ins: hlo_text.Instruction) -> list[str]:
    return ins.operand_names


def _param_index(ins: hlo_text.Instruction) -> int | None:
    m = re.match(r"\s*(\d+)", ins.operands)
    return int(m.group(1)) if m else None


def _array_bytes(shape) -> int:
    """Bytes of a shape, leaving out cuBLAS / cuDNN workspace (the trailing s8/u8 array of a custom
    call's result tuple is scratch, not HBM traffic worth a read and a write)."""
    if isinstance(shape, tuple):
        parts = list(shape)
        if len(parts) > 1 and isinstance(parts[-1], hlo_text.Array) and parts[-1].dtype in ("s8", "u8"):
            parts = parts[:-1]
        return sum(hlo_text.shape_bytes(p) for p in parts)
    return hlo_text.shape_bytes(shape)


class _Fused:
    """Facts about one fused computation: its root(s), its parameters' users."""

    def __init__(self, comp: hlo_text.Computation):
        self.comp = comp
        by_name = {i.name: i for i in comp.instructions}
        self.by_name = by_name
        root_name = None
        for line in comp.lines:
            m = re.match(r"^\s*ROOT\s+%?([\w.\-]+)\s+=", line)
            if m:
                root_name = m.group(1)
        self.root = by_name.get(root_name) if root_name else (comp.instructions[-1] if comp.instructions else None)
        self.users: dict[str, list[hlo_text.Instruction]] = defaultdict(list)
        for i in comp.instructions:
            for n in _operand_names(i):
                self.users[n].append(i)
        self.params = {idx: i for i in comp.instructions if i.opcode == "parameter"
                       and (idx := _param_index(i)) is not None}

    def source_param(self, name: str) -> int | None:
        """The parameter index `name` is a view of (through bitcasts / reshapes), or None."""
        seen = 0
        while name in self.by_name and seen < 64:
            ins = self.by_name[name]
            if ins.opcode == "parameter":
                return _param_index(ins)
            if ins.opcode not in _PASS:
                return None
            ops = _operand_names(ins)
            if not ops:
                return None
            name, seen = ops[0], seen + 1
        return None

    @cached_property
    def roots(self) -> list[hlo_text.Instruction]:
        if self.root is None:
            return []
        if self.root.opcode == "tuple":
            return [self.by_name[n] for n in _operand_names(self.root) if n in self.by_name]
        return [self.root]

    def in_place(self) -> tuple[dict[int, int], int]:
        """({aliased parameter index: bytes written into it}, bytes of the other results)."""
        aliased: dict[int, int] = {}
        other = 0
        for r in self.roots:
            node = r
            while node.opcode in _PASS and _operand_names(node) and _operand_names(node)[0] in self.by_name:
                node = self.by_name[_operand_names(node)[0]]
            ops = _operand_names(node)
            if node.opcode in ("dynamic-update-slice", "scatter") and ops:
                p = self.source_param(ops[0])
                upd = self.by_name.get(ops[1] if node.opcode == "dynamic-update-slice" else ops[-1])
                if p is not None and upd is not None:
                    aliased[p] = aliased.get(p, 0) + hlo_text.shape_bytes(upd.shape)
                    continue
            other += hlo_text.shape_bytes(r.shape) if isinstance(r.shape, hlo_text.Array) else _array_bytes(r.shape)
        return aliased, other

    def read_bytes(self, index: int, full: int) -> int:
        """Bytes of parameter `index` the fusion reads: its slices' if every use slices it, else all."""
        p = self.params.get(index)
        if p is None:
            return full
        sliced, frontier = 0, [p.name]
        while frontier:
            name = frontier.pop()
            for u in self.users.get(name, ()):
                if u.opcode in _PASS:
                    frontier.append(u.name)
                elif u.opcode in _SLICERS and _operand_names(u)[:1] == [name]:
                    sliced += hlo_text.shape_bytes(u.shape)
                elif u.opcode in ("dynamic-update-slice", "scatter") and _operand_names(u)[:1] == [name]:
                    pass    # the buffer updated in place: not read
                else:
                    return full
        return min(sliced, full)


def _reachable(module: hlo_text.Module, root: str) -> list[str]:
    return module.reachable(root)


def control_computations(module: hlo_text.Module) -> set[str]:
    """Computations whose instructions are launched as kernels: the entry, loop bodies and conditions,
    conditional branches and called computations (not fusion bodies or reducers)."""
    out, stack = set(), [module.entry]
    while stack:
        name = stack.pop()
        if name in out or name not in module.computations:
            continue
        out.add(name)
        for ins in module.computations[name].instructions:
            if ins.opcode in ("while", "conditional", "call"):
                stack.extend(c for a, c in ins.called if a != "to_apply" or ins.opcode == "call")
    return out


_NO_KERNEL_CALLS = ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost",
                    "MoveToDevice", "AllocateBuffer", "annotate_device_placement")


class _Reader:
    """One module's instructions read as kernels: its dots by computation and its fusions' bodies, read once."""

    def __init__(self, module: hlo_text.Module):
        self.module = module
        self.by_name = module.by_name
        self.fused_cache: dict[str, _Fused] = {}
        self.dots_in: dict[str, list] = defaultdict(list)   # computation -> [(dot instruction, flops, kind)]
        for ins, flops, kind in dots_mod._dots(module):
            self.dots_in[ins.computation].append((ins, flops, kind))

    def fused(self, name: str) -> _Fused:
        if name not in self.fused_cache:
            self.fused_cache[name] = _Fused(self.module.computations[name])
        return self.fused_cache[name]

    def operand_bytes(self, ins) -> list[int]:
        return [_array_bytes(self.by_name[n].shape) if n in self.by_name else 0 for n in _operand_names(ins)]

    def kernel(self, ins, cname: str, runs: int) -> Kernel | None:
        """The kernel one instruction of a control computation launches (None: no kernel)."""
        op = ins.opcode
        if op in _FREE or op in _HOST:
            return None
        if op in COLLECTIVE_OPS or (op == "async-start" and any(
                c in ins.attrs for c in ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
                                         "collective-permute"))):
            return Kernel(ins.name, cname, op, "collective", runs, 0.0)
        if op in ("fusion", "fusion-start", "async-start"):
            return self.fusion(ins, cname, runs)
        if op == "custom-call":
            return self.custom_call(ins, cname, runs)
        return self.plain(ins, cname, runs)

    def fusion(self, ins, cname: str, runs: int) -> Kernel:
        """A fusion: the bytes it reads and writes (in-place updates, sliced reads); a GEMM if it calls dots."""
        module, op = self.module, ins.opcode
        callee = dict(ins.called).get("calls")
        if callee is None or callee not in module.computations:
            return Kernel(ins.name, cname, op, "memory", runs, float(sum(self.operand_bytes(ins))))
        f = self.fused(callee)
        aliased, written = f.in_place()
        read = 0
        codes = 0
        floats_out = any(a.dtype in _FLOATS for a in _arrays(ins.shape))
        for i, (name, b) in enumerate(zip(_operand_names(ins), self.operand_bytes(ins), strict=True)):
            got = 0 if i in aliased else f.read_bytes(i, b)
            read += got
            src = self.by_name.get(name)
            if floats_out and src is not None and any(a.dtype in QUANTIZED_CODES for a in _arrays(src.shape)):
                codes += got
        moved = float(read + written + sum(aliased.values()))
        dots = [d for c in _reachable(module, callee) for d in self.dots_in.get(c, ())]
        if not dots:
            return Kernel(ins.name, cname, op, "memory", runs, float(moved), dequantized_bytes=codes)
        flops = sum(fl for _, fl, _ in dots)
        big = max(dots, key=lambda d: d[1])
        return Kernel(ins.name, cname, op, "gemm", runs, float(moved), flops, big[2], _gemm_dims(module, big[0]),
                      dequantized_bytes=codes)

    def custom_call(self, ins, cname: str, runs: int) -> Kernel | None:
        """cuDNN attention, a cuBLAS GEMM, a marker that launches nothing, or another library kernel."""
        module, op = self.module, ins.opcode
        target = (ins.attr("custom_call_target") or "").strip('"')
        moved = float(sum(self.operand_bytes(ins)) + _array_bytes(ins.shape))
        if target.startswith("__cudnn$fmha"):
            return Kernel(ins.name, cname, op, "attention", runs, moved,
                          dots_mod._custom_call_flops(module, ins), ("bf16", 1), None, "Backward" in target)
        if target.startswith("__cublas"):
            own = self.dots_in.get(cname, ())
            kind = next((k for d, _, k in own if d.name == ins.name), ("bf16", 1))
            return Kernel(ins.name, cname, op, "gemm", runs, moved,
                          dots_mod._custom_call_flops(module, ins), kind, _gemm_dims(module, ins))
        if target in _NO_KERNEL_CALLS:
            return None
        return Kernel(ins.name, cname, op, "memory", runs, moved)

    def plain(self, ins, cname: str, runs: int) -> Kernel:
        """An unfused instruction: slices and in-place updates move what they touch; a dot is a GEMM."""
        op = ins.opcode
        if op == "dynamic-update-slice":
            ops = _operand_names(ins)
            upd = self.by_name.get(ops[1]) if len(ops) > 1 else None
            moved = 2.0 * (hlo_text.shape_bytes(upd.shape) if upd is not None else 0)
        elif op in ("dynamic-slice", "slice", "copy"):
            moved = 2.0 * _array_bytes(ins.shape)
        else:
            moved = float(sum(self.operand_bytes(ins)) + _array_bytes(ins.shape))
            own = [d for d in self.dots_in.get(cname, ()) if d[0].name == ins.name] if op == "dot" else []
            if own:
                return Kernel(ins.name, cname, op, "gemm", runs, moved, own[0][1], own[0][2],
                              _gemm_dims(self.module, ins))
        return Kernel(ins.name, cname, op, "memory", runs, moved)


def unevaluated_conditions(module: hlo_text.Module) -> set[str]:
    """The condition computations of loops with a known trip count: XLA:GPU's WhileThunk then runs the body
    that many times and never launches the condition (xla/backends/gpu/runtime/while_thunk.cc,
    ``if (trip_count_.has_value())``)."""
    trips = module.trip_counts
    out = set()
    for ins in module.instructions():
        if ins.opcode == "while" and trips.get(ins.name):
            cond = dict(ins.called).get("condition")
            if cond:
                out.add(cond)
    return out


def kernels(module: hlo_text.Module) -> list[Kernel]:
    """Every kernel launch site of the step with its class, bytes and FLOPs (see the module docstring)."""
    reader = _Reader(module)
    out: list[Kernel] = []
    for cname in sorted(control_computations(module) - unevaluated_conditions(module)):   # a fixed order
        runs = module.multiplicity.get(cname, 0)
        if not runs:
            continue
        for ins in module.computations[cname].instructions:
            k = reader.kernel(ins, cname, runs)
            if k is not None:
                out.append(k)
    return out


def _gemm_dims(module: hlo_text.Module, ins: hlo_text.Instruction) -> tuple[int, int, int, int] | None:
    """(batch, m, n, k) of a dot or cuBLAS GEMM from its operand shapes and dimension numbers."""
    arrays = [a for a in dots_mod._operand_shapes(module, ins) if isinstance(a, hlo_text.Array)]
    if len(arrays) < 2:
        return None
    if ins.opcode == "dot":
        dn = {f"{s}_{w}_dimensions": dots_mod._dims_attr(ins, f"{s}_{w}_dims")
              for s in ("lhs", "rhs") for w in ("contracting", "batch")}
    else:
        dn = ins.backend_config.get("gemm_backend_config", {}).get("dot_dimension_numbers")
        if dn is None:
            return None
    lhs, rhs = arrays[0], arrays[1]
    lc, rc = dots_mod._dims(dn, "lhs_contracting_dimensions"), dots_mod._dims(dn, "rhs_contracting_dimensions")
    lb, rb = dots_mod._dims(dn, "lhs_batch_dimensions"), dots_mod._dims(dn, "rhs_batch_dimensions")
    batch = math.prod(lhs.dims[i] for i in lb if i < len(lhs.dims))
    k = math.prod(lhs.dims[i] for i in lc if i < len(lhs.dims))
    m = math.prod(d for i, d in enumerate(lhs.dims) if i not in lc and i not in lb)
    n = math.prod(d for i, d in enumerate(rhs.dims) if i not in rc and i not in rb)
    return batch, m, n, k


def bytes_per_step(ks: list[Kernel]) -> float:
    """HBM bytes the non-collective kernels move per step."""
    return sum(k.bytes * k.runs for k in ks if k.klass != "collective")


def updates_in_place(module: hlo_text.Module, ins: hlo_text.Instruction) -> bool:
    """Whether a kernel writes into a buffer in place (a bare dynamic-update-slice, or a fusion whose root is
    one: a scan's stacked residual or gradient written layer by layer)."""
    if ins.opcode == "dynamic-update-slice":
        return True
    callee = dict(ins.called).get("calls")
    return callee in module.computations and bool(_Fused(module.computations[callee]).in_place()[0])


def operand_traffic(module: hlo_text.Module, ins: hlo_text.Instruction, index: int) -> int:
    """Bytes a kernel moves for its operand `index`: what it reads of it (a slice's bytes where it only
    slices it), and, where the kernel only slices it out (a bare or fused dynamic-slice), the slice written."""
    names = ins.operand_names
    operand = module.by_name.get(names[index]) if index < len(names) else None
    if operand is None:
        return 0
    full = _array_bytes(operand.shape)
    if ins.opcode in _SLICERS:
        return 2 * _array_bytes(ins.shape) if index == 0 else 0
    callee = dict(ins.called).get("calls")
    if callee not in module.computations:
        return full
    f = _Fused(module.computations[callee])
    read = f.read_bytes(index, full)
    if f.root is not None and f.root.opcode in _SLICERS:   # the fusion copies a slice out: its write too
        read += _array_bytes(ins.shape)
    return read
