"""XLA's buffer assignment, decoded: every logical buffer, where it lives, and memory over time.

XLA writes the optimized module and its buffer assignment as one ``xla.HloProto``
(``hlo_module`` = 1, ``buffer_assignment`` = 3) when a compile is given the dump options of
:func:`compile_options`. For a deviceless GPU compile this dump is the only way to get them
(``memory_analysis().serialized_buffer_assignment_proto`` is empty through the PJRT C API).
:func:`read_dump` finds that file and :func:`decode_hlo_proto` decodes it with a small reader
of the protobuf wire format (no generated code, no schema files): only the fields named below
are read, everything else is skipped by its length.

The memory curve is XLA's own: ``ComputePeakMemory`` in ``xla/service/buffer_assignment.cc``
(what PJRT reports as ``peak_memory_in_bytes``) does exactly this, and so do we:

1. Static memory. For each allocation that is not thread-local and is an entry parameter, a
   constant or maybe-live-out, the *largest* logical buffer assigned to it (the first of equal
   size, in the proto's order) takes one reference, and its size counts for the whole program.
2. Every heap-simulator trace, in proto order, one after the other, *without resetting* memory
   between traces: ``ALLOC`` takes a reference on the buffer (memory grows by its size on the
   first one), ``SHARE_WITH`` takes a reference on the root of the canonical buffer (the buffer
   itself adds nothing), ``FREE`` drops a reference on the root of the buffer it names.
3. The peak is the largest value reached, the static memory included.

With whole-module heap simulation (the usual case on CPU and GPU: every global computation is
sequential) there is one trace and the curve is the real program order. Otherwise, and when
buffers of another memory color get their own temp allocation (e.g. NCCL user buffers,
``xla_gpu_enable_nccl_user_buffers``), there is one trace per simulation; XLA chains them as
above (the second starts when the first has freed everything), so our maximum still equals
``peak_memory_in_bytes``, but the curve is then an event order, not one program order, and
XLA's peak does not add up memory that two traces hold at the same time.

Backends. For the deviceless GPU target our peak equals ``peak_memory_in_bytes`` exactly. On
the CPU backend ``peak_memory_in_bytes`` is computed on a buffer assignment that PJRT rebuilt
from a proto (``BufferAssignment::FromProto`` keeps no heap-simulator traces), so it is the
static memory alone: ``timeline[0]`` of the dump, which the in-memory
``serialized_buffer_assignment_proto`` (:func:`decode_buffer_assignment`) reproduces
exactly. The dump keeps the trace, so our curve adds the temporaries XLA:CPU leaves out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Buffer",
    "BufferAssignment",
    "CATEGORIES",
    "categorize",
    "compile_options",
    "decode_buffer_assignment",
    "decode_hlo_proto",
    "module_path",
    "read_dump",
]

CATEGORIES = (
    "params", "optimizer_state", "batch", "other_state",
    "gradients", "param_copies", "activations", "collectives", "outputs", "temporaries",
)


# --------------------------------------------------------------------------------------------
# The protobuf wire format: varints, length-delimited fields, fixed32 / fixed64.
# --------------------------------------------------------------------------------------------

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


def _fields(buf: bytes, pos: int, end: int, want: frozenset[int]) -> dict[int, list]:
    """The fields numbered in ``want`` of the message ``buf[pos:end]``, in wire order.

    A varint field gives an int (unsigned; see :func:`_signed`), a length-delimited one the
    ``(start, stop)`` span of its payload in ``buf``, a fixed64 / fixed32 one its raw little-endian
    value. Fields not in ``want`` are skipped without being decoded. The varint loops are inlined:
    this function carries the whole decode.
    """
    out: dict[int, list] = {}
    while pos < end:
        b = buf[pos]
        pos += 1
        if b < 0x80:
            key = b
        else:
            key = b & 0x7F
            shift = 7
            while True:
                b = buf[pos]
                pos += 1
                key |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
        wire = key & 7
        if wire == _VARINT:
            b = buf[pos]
            pos += 1
            if b < 0x80:
                val = b
            else:
                val = b & 0x7F
                shift = 7
                while True:
                    b = buf[pos]
                    pos += 1
                    val |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
        elif wire == _LEN:
            b = buf[pos]
            pos += 1
            if b < 0x80:
                n = b
            else:
                n = b & 0x7F
                shift = 7
                while True:
                    b = buf[pos]
                    pos += 1
                    n |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
            val = (pos, pos + n)
            pos += n
        elif wire == _FIXED64:
            val = int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wire == _FIXED32:
            val = int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        else:  # groups (3, 4) are not used by any message read here
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {pos}")
        f = key >> 3
        if f in want:
            lst = out.get(f)
            if lst is None:
                out[f] = [val]
            else:
                lst.append(val)
    if pos != end:
        raise ValueError("truncated protobuf message")
    return out


def _signed(v: int) -> int:
    """An int64 read as an unsigned varint, back to its sign (two's complement)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _packed(buf: bytes, vals: list | None) -> list[int]:
    """A repeated int64 field: packed spans and/or plain varints, in order, signed."""
    if not vals:
        return []
    out: list[int] = []
    for v in vals:
        if isinstance(v, int):
            out.append(_signed(v))
            continue
        pos, end = v
        while pos < end:
            b = buf[pos]
            pos += 1
            x = b & 0x7F
            shift = 7
            while b >= 0x80:
                b = buf[pos]
                pos += 1
                x |= (b & 0x7F) << shift
                shift += 7
            out.append(_signed(x))
    return out


def _str(buf: bytes, vals: list | None) -> str:
    if not vals:
        return ""
    s, e = vals[-1]
    return buf[s:e].decode("utf-8", "replace")


def _int(vals: list | None, default: int = 0) -> int:
    return _signed(vals[-1]) if vals else default


# Field numbers (xla/service/hlo.proto, xla/xla_data.proto).
_HLO_PROTO = frozenset({1, 3})                 # hlo_module, buffer_assignment
_MODULE = frozenset({1, 3, 6})                 # name, computations, entry_computation_id
_COMPUTATION = frozenset({1, 2, 5, 6})         # name, instructions, id, root_id
_INSTRUCTION = frozenset({1, 2, 3, 7, 35, 36, 38})  # name, opcode, shape, metadata, id, operand_ids, called_computation_ids
_SHAPE = frozenset({2, 3, 4})                  # element_type, dimensions, tuple_shapes
_METADATA = frozenset({2})                     # op_name
_ASSIGNMENT = frozenset({1, 3, 4})             # logical_buffers, buffer_allocations, heap_simulator_traces
_LOGICAL = frozenset({1, 2, 3})                # id, size, defined_at
_LOCATION = frozenset({3, 4})                  # shape_index, instruction_id
_ALLOCATION = frozenset({1, 2, 3, 5, 6, 7, 9, 10, 12})
_ASSIGNED = frozenset({1, 2})                  # logical_buffer_id, offset
_TRACE = frozenset({1})                        # events
_EVENT = frozenset({1, 2, 5})                  # kind, buffer_id, share_with_canonical_id

_ALLOC, _FREE, _SHARE_WITH = 0, 1, 2

# xla.PrimitiveType -> the spelling of HLO text.
_DTYPES = {
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32", 9: "u64",
    10: "f16", 11: "f32", 12: "f64", 13: "tuple", 14: "opaque", 15: "c64", 16: "bf16",
    17: "token", 18: "c128", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4",
    23: "f8e4m3b11fnuz", 24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "s2", 27: "u2",
    28: "f8e4m3", 29: "f8e3m4", 30: "s1", 31: "u1", 32: "f4e2m1fn", 33: "f8e8m0fnu",
}


def _subshape(buf: bytes, span: tuple[int, int] | None, index: Sequence[int]) -> tuple[tuple[int, ...], str]:
    """(dimensions, dtype) of the ShapeProto at ``span``, followed down the tuple ``index``."""
    if span is None:
        return (), ""
    f = _fields(buf, span[0], span[1], _SHAPE)
    for i in index:
        tuples = f.get(4)
        if not tuples or i >= len(tuples):
            break
        s, e = tuples[i]
        f = _fields(buf, s, e, _SHAPE)
    et = _int(f.get(2))
    return tuple(_packed(buf, f.get(3))), _DTYPES.get(et, f"type{et}")


# --------------------------------------------------------------------------------------------
# Names: what the op_name metadata says about a buffer.
# --------------------------------------------------------------------------------------------

# Path components JAX adds that are not the user's scopes: loop and call scaffolding.
_SCAFFOLD = frozenset({
    "while", "body", "cond", "branch", "checkpoint", "remat", "rematted_computation",
    "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
    "shard_map", "scan",
})
_CALL = re.compile(r"^([\w.\-]+)\((.*)\)$")
# Wrappers naming a called *function*, not a scope: the whole component goes.
_FUNCTION_WRAPPERS = frozenset({"jit", "pjit", "xla_call", "xla_pmap", "pmap", "custom_jvp", "custom_vjp"})


def _split_path(op_name: str) -> list[str]:
    """Split at '/' outside parentheses (a wrapper's argument may hold a '/')."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(op_name):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "/" and depth == 0:
            parts.append(op_name[start:i])
            start = i + 1
    parts.append(op_name[start:])
    return parts


def _unwrap(part: str) -> str:
    """'transpose(jvp(layers))' -> 'layers'; 'jvp()' -> ''; 'jit(step)' -> ''."""
    while True:
        m = _CALL.match(part)
        if m is None:
            return part
        if m.group(1) in _FUNCTION_WRAPPERS:
            return ""
        part = m.group(2)


def module_path(op_name: str) -> str:
    """The user's scope path in a JAX ``op_name``: the final primitive name, transform
    wrappers, called-function names (``jit(...)``), loop / remat scaffolding and einsum
    equations removed.

    JAX writes a transform around the first scope traced under it: ``jvp(Llama)``,
    ``transpose(jvp(layers))``, ``jvp()`` when there is none; that scope is kept.

    >>> module_path("jit(step)/transpose(jvp(Llama))/layers/attn/dot_general")
    'Llama/layers/attn'
    >>> module_path("jit(step)/jvp(layers)/while/body/closed_call/attn/bthd,bshd->bhts/dot_general")
    'layers/attn'
    >>> module_path("jit(step)/jvp()/mul")
    ''

    XLA joins the op_names of instructions it merged with ``;``: the result is the longest
    scope prefix their (non-empty) paths share.

    >>> module_path("jit(f)/jvp(Net)/block0/up/add;jit(f)/jvp(Net)/block0/mlp/add;jit(f)/jvp()/mul")
    'Net/block0'
    """
    if ";" in op_name:
        paths = {module_path(piece) for piece in op_name.split(";")} - {""}
        if not paths:
            return ""
        split = [p.split("/") for p in paths]
        common = []
        for parts in zip(*split):
            if len(set(parts)) != 1:
                break
            common.append(parts[0])
        return "/".join(common)
    if not op_name or "/" not in op_name:
        return ""
    out = []
    for part in _split_path(op_name)[:-1]:     # the last component is the primitive
        part = _unwrap(part)
        if part and part not in _SCAFFOLD and "->" not in part:
            out.append(part)
    return "/".join(out)


def _is_backward(op_name: str) -> bool:
    return "transpose(" in op_name


_COLLECTIVES = frozenset({
    "all-gather", "all-gather-start", "all-gather-done",
    "all-reduce", "all-reduce-start", "all-reduce-done",
    "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-permute-start", "collective-permute-done",
    "collective-broadcast",
})
_ASYNC = frozenset({"async-start", "async-update", "async-done"})


# --------------------------------------------------------------------------------------------
# The result types.
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Buffer:
    """One logical buffer of XLA's buffer assignment (an HloValue: one instruction output, or
    one element of a tuple-shaped output).

    ``is_parameter`` / ``parameter_number`` / ``parameter_shape_index`` / ``live_out`` /
    ``is_constant`` describe the *allocation* the buffer is assigned to: the updated value of a
    donated parameter lives in that parameter's allocation, so it reads ``is_parameter`` and
    ``live_out``. ``start`` / ``end`` are the buffer's own live range as indices into
    :attr:`BufferAssignment.timeline` (inclusive); buffers of entry-parameter, constant and
    live-out allocations span ``0 .. len(timeline) - 1``; buffers that never occupy heap memory
    (thread-local scalars, tuple tables XLA does not simulate) have ``start = end = -1``.
    """

    id: int
    size: int
    instruction: str
    shape_index: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    opcode: str
    op_name: str
    module_path: str
    allocation: int
    offset: int
    is_parameter: bool
    parameter_number: int | None
    parameter_shape_index: tuple[int, ...]
    live_out: bool
    is_constant: bool
    start: int
    end: int
    is_backward: bool
    computation: str = ""          # the HLO computation that defines it (a loop body, the entry...)
    collective: bool = False       # a collective's output, async forms and wrapped async ops included
    is_thread_local: bool = False


@dataclass(frozen=True, eq=False)   # holds arrays: compared by identity
class BufferAssignment:
    """All logical buffers and XLA's memory curve (see the module docstring for how it is built).

    ``timeline[0]`` is the memory before the first heap event (entry parameters, constants,
    live-out allocations); ``timeline[i]`` for ``i >= 1`` is the memory after the ``i``-th event.
    ``peak_bytes == timeline.max() == memory_analysis().peak_memory_in_bytes``.
    """

    buffers: tuple[Buffer, ...]
    timeline: np.ndarray
    peak_bytes: int
    peak_index: int
    module_name: str = ""
    # Which buffer's bytes are counted over which (inclusive) span of the timeline: a buffer
    # that SHARE_WITHs another adds nothing; its canonical buffer holds the bytes until the last
    # sharer is freed. Index i of these arrays is one span.
    owner: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    owner_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    owner_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    traces: tuple[int, ...] = ()         # timeline index of each heap-simulator trace's first event
    backward_start: int | None = None    # timeline index where the backward pass begins
    backward_end: int | None = None      # timeline index of its last allocation
    # (shape, dtype) -> flat argument indices of the entry parameters with that shape
    param_shapes: dict = field(default_factory=dict, repr=False)

    def live_at(self, index: int, *, include_shared: bool = False) -> list[Buffer]:
        """The buffers whose bytes make up ``timeline[index]``: their sizes sum to it exactly.

        A buffer that others SHARE_WITH keeps holding its bytes after its own ``end`` while they
        live. With ``include_shared`` also the buffers live at ``index`` that share another buffer's
        memory (in-place updates, loop-carried values, bitcasts): they add no bytes.
        """
        n = len(self.timeline)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"timeline index {index} out of range 0..{n - 1}")
        mask = (self.owner_start <= index) & (index <= self.owner_end)
        out = [self.buffers[i] for i in self.owner[mask]]
        if include_shared:
            seen = {b.id for b in out}
            out += [b for b in self.buffers if b.start <= index <= b.end and b.id not in seen]
        return sorted(out, key=lambda b: -b.size)

    def live_at_peak(self, *, include_shared: bool = False) -> list[Buffer]:
        return self.live_at(self.peak_index, include_shared=include_shared)

    def categorize(self, buffer: Buffer, param_categories: Sequence[str]) -> str:
        return categorize(buffer, param_categories, assignment=self)

    def categories_at(self, index: int, param_categories: Sequence[str]) -> dict[str, int]:
        """Bytes per category at ``index``; the values sum to ``timeline[index]``."""
        out = dict.fromkeys(CATEGORIES, 0)
        for b in self.live_at(index):
            out[categorize(b, param_categories, assignment=self)] += b.size
        return out


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("f", "bf"))


# --------------------------------------------------------------------------------------------
# Categories.
# --------------------------------------------------------------------------------------------

def categorize(buffer: Buffer, param_categories: Sequence[str], *,
               assignment: BufferAssignment | None = None) -> str:
    """Which part of a training step a buffer's bytes belong to. Heuristics, first match wins:

    - an entry parameter's allocation (a donated parameter's in-place update included):
      ``param_categories[i]``, ``i`` the flat argument index: the parameter number, or, when XLA
      passes all arguments as one tuple parameter, the first element of
      ``parameter_shape_index``. ``"other_state"`` if the caller gave no category for it.
    - ``"outputs"``: live out of the program and not aliased to a parameter.
    - ``"collectives"``: the output of an all-gather / reduce-scatter / all-reduce / all-to-all /
      collective-permute, their ``-start`` / ``-done`` forms and async ops wrapping them.
    - ``"gradients"``: the shape of a floating-point ``"params"`` entry parameter (per device; any
      float dtype: mixed precision accumulates bf16 gradients of fp32 params), not defined in
      the forward pass (``op_name`` without ``jvp(``, or with ``transpose(``: the backward pass
      or an XLA-made zero accumulator), live during the backward pass. Needs ``assignment``.
    - ``"param_copies"``: a forward-pass ``convert_element_type`` with a param's shape: the bf16
      compute copy of an fp32 parameter under mixed precision (kept for the backward pass).
    - ``"activations"``: not defined in the backward pass and still live when it begins
      (``assignment.backward_start``): values saved for the backward pass. Needs
      ``assignment``.
    - ``"temporaries"``: everything else (fusion temporaries, loop-local values, cuBLAS / cuDNN
      workspaces from custom calls, constants).
    """
    if buffer.is_parameter:
        if buffer.dtype == "tuple":          # the pointer table of a tupled parameter
            return "other_state"
        number = buffer.parameter_shape_index[0] if buffer.parameter_shape_index else (buffer.parameter_number or 0)
        if 0 <= number < len(param_categories):
            return param_categories[number]
        return "other_state"
    if buffer.live_out:
        return "outputs"
    if buffer.collective:
        return "collectives"
    if assignment is not None and assignment.backward_start is not None and buffer.start >= 0:
        forward = "jvp(" in buffer.op_name and not buffer.is_backward
        # by shape alone: under mixed precision the backward pass accumulates bf16 gradients
        # of fp32 parameters
        like = assignment.param_shapes.get(buffer.shape, ()) if _is_float(buffer.dtype) else ()
        is_param_shape = buffer.shape and any(0 <= i < len(param_categories) and param_categories[i] == "params"
                                              for i in like)
        if (not forward and is_param_shape
                and buffer.start <= assignment.backward_end and buffer.end >= assignment.backward_start):
            return "gradients"
        if forward and is_param_shape and buffer.op_name.endswith("convert_element_type"):
            return "param_copies"
        if not buffer.is_backward and buffer.start < assignment.backward_start <= buffer.end:
            return "activations"
    return "temporaries"


# --------------------------------------------------------------------------------------------
# Decoding.
# --------------------------------------------------------------------------------------------

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
    wrote into ``dump_dir``.

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
            "jaxmem.xla.buffers.compile_options(dump_dir)?")
    if module_name_hint:
        hinted = [n for n in names if module_name_hint in n]
        if not hinted:
            raise FileNotFoundError(f"no dumped module matches {module_name_hint!r} in {dump_dir}: {sorted(names)}")
        names = hinted
    jitted = [n for n in names if ".jit_" in n or n.startswith("jit_")]
    pick = sorted(jitted or names, key=_module_number)[-1]
    with open(os.path.join(dump_dir, pick), "rb") as f:
        return decode_hlo_proto(f.read())


def _module_number(name: str) -> tuple[int, str]:
    m = re.match(r"module_(\d+)", name)
    return (int(m.group(1)) if m else -1, name)


def decode_hlo_proto(data: bytes) -> BufferAssignment:
    """Decode a serialized ``xla.HloProto`` (optimized module + buffer assignment)."""
    buf = bytes(data)
    top = _fields(buf, 0, len(buf), _HLO_PROTO)
    if 3 not in top:
        raise ValueError("this HloProto has no buffer_assignment (dump the after-optimizations module)")
    s, e = top[3][-1]
    module = None
    if 1 in top:
        ms, me = top[1][-1]
        module = _fields(buf, ms, me, _MODULE)
    return _assignment(buf, s, e, module)


def decode_buffer_assignment(data: bytes) -> BufferAssignment:
    """Decode a serialized ``xla.BufferAssignmentProto`` alone (as in the CPU backend's
    ``memory_analysis().serialized_buffer_assignment_proto``): no instruction names, shapes or
    op_names, which live in the module."""
    buf = bytes(data)
    return _assignment(buf, 0, len(buf), None)


def _instructions(buf: bytes, module: dict, needed: set[int]) -> dict[int, tuple]:
    """instruction id -> (name, opcode, shape span, op_name, computation name, wrapped opcode),
    for the instructions in ``needed`` (and maybe a few more).

    Most of a module is fusion computations, which define no buffers. An HloInstructionProto
    id carries its computation's id in the upper 32 bits, so only the computations holding
    needed instructions are read; any instruction not found that way is looked for everywhere.
    """
    comps: dict[int, dict] = {}
    for s, e in module.get(3, ()):
        comp = _fields(buf, s, e, _COMPUTATION)
        comps[_int(comp.get(5))] = comp
    out: dict[int, tuple] = {}
    calls: list[tuple[int, int]] = []    # (async-start id, called computation id)
    follows: list[tuple[int, int]] = []  # (async-update / -done id, its async-start operand id)
    done: set[int] = set()

    def read(cid: int) -> None:
        comp = comps.get(cid)
        if comp is None or cid in done:
            return
        done.add(cid)
        cname = _str(buf, comp.get(1))
        for a, b in comp.get(2, ()):
            ins = _fields(buf, a, b, _INSTRUCTION)
            opcode = _str(buf, ins.get(2))
            op_name = ""
            meta = ins.get(7)
            if meta:
                ms, me = meta[-1]
                op_name = _str(buf, _fields(buf, ms, me, _METADATA).get(2))
            iid = _int(ins.get(35))
            shape = ins.get(3)
            out[iid] = (_str(buf, ins.get(1)), opcode, shape[-1] if shape else None, op_name, cname, "")
            if opcode in _ASYNC:
                if 38 in ins:
                    calls.append((iid, _packed(buf, ins[38])[0]))
                elif 36 in ins:
                    follows.append((iid, _packed(buf, ins[36])[0]))

    for cid in sorted({i >> 32 for i in needed}):
        read(cid)
    if not needed.issubset(out):
        for cid in comps:
            read(cid)
    for iid, cid in calls:           # async-start/-done: what they wrap (a collective?)
        comp = comps.get(cid)
        if comp is None or 6 not in comp:
            continue
        root = _int(comp[6])
        read(root >> 32)
        if root not in out:
            read(cid)
        name, opcode, shape, op_name, cname, _ = out[iid]
        out[iid] = (name, opcode, shape, op_name, cname, out[root][1] if root in out else "")
    for iid, start in follows:       # newer XLA lists the called computation on the start only
        if start in out:
            name, opcode, shape, op_name, cname, _ = out[iid]
            out[iid] = (name, opcode, shape, op_name, cname, out[start][5])
    return out


def _assignment(buf: bytes, s: int, e: int, module: dict | None) -> BufferAssignment:
    ba = _fields(buf, s, e, _ASSIGNMENT)

    # Logical buffers, in proto order: id -> (size, instruction id, shape index).
    ids: list[int] = []
    sizes: list[int] = []
    where: list[tuple[int, tuple[int, ...]]] = []
    for a, b in ba.get(1, ()):
        lb = _fields(buf, a, b, _LOGICAL)
        ids.append(_int(lb.get(1)))
        sizes.append(_int(lb.get(2)))
        loc = lb.get(3)
        if loc:
            la, lz = loc[-1]
            lf = _fields(buf, la, lz, _LOCATION)
            where.append((_int(lf.get(4), -1), tuple(_packed(buf, lf.get(3)))))
        else:
            where.append((-1, ()))
    index_of = {bid: i for i, bid in enumerate(ids)}
    n = len(ids)
    module_name = _str(buf, module.get(1)) if module else ""
    instructions = _instructions(buf, module, {w[0] for w in where if w[0] >= 0}) if module else {}

    # Allocations: which buffer sits where, and which allocations live for the whole program.
    alloc_of = [-1] * n
    offset_of = [0] * n
    alloc_info: dict[int, tuple] = {}
    static_roots: list[int] = []          # buffer positions holding one static reference each
    for a, b in ba.get(3, ()):
        al = _fields(buf, a, b, _ALLOCATION)
        index = _int(al.get(1))
        thread_local = bool(_int(al.get(3)))
        is_param = bool(_int(al.get(5)))
        live_out = bool(_int(al.get(7)))
        is_const = bool(_int(al.get(12)))
        alloc_info[index] = (is_param, _int(al.get(6)) if is_param else None,
                             tuple(_packed(buf, al.get(10))), live_out, is_const, thread_local)
        largest, largest_size = -1, 0
        for x, y in al.get(9, ()):
            asg = _fields(buf, x, y, _ASSIGNED)
            i = index_of.get(_int(asg.get(1)))
            if i is None:
                continue
            alloc_of[i] = index
            offset_of[i] = _int(asg.get(2))
            if sizes[i] > largest_size:
                largest, largest_size = i, sizes[i]
        if not thread_local and (is_param or is_const or live_out) and largest >= 0:
            static_roots.append(largest)

    # Heap-simulator events of all traces, chained in proto order.
    kinds: list[int] = []
    who: list[int] = []
    canon: list[int] = []
    traces: list[int] = []
    for a, b in ba.get(4, ()):
        tr = _fields(buf, a, b, _TRACE)
        traces.append(len(kinds) + 1)
        for x, y in tr.get(1, ()):
            ev = _fields(buf, x, y, _EVENT)
            kind = _int(ev.get(1))
            try:
                who.append(index_of[_int(ev.get(2))])
                canon.append(index_of[_int(ev.get(5))] if kind == _SHARE_WITH else -1)
            except KeyError as e:
                raise ValueError(f"heap-simulator event names logical buffer {e.args[0]}, which the "
                                 "assignment does not define") from None
            kinds.append(kind)

    timeline, owner, o_start, o_end, b_start, b_end = _simulate(np.asarray(sizes, np.int64), static_roots,
                                                                kinds, who, canon)
    last = len(timeline) - 1

    buffers: list[Buffer] = []
    param_shapes: dict = {}
    paths: dict[str, str] = {}
    for i in range(n):
        iid, shape_index = where[i]
        name, opcode, shape_span, op_name, cname, wrapped = instructions.get(iid, ("", "", None, "", "", ""))
        shape, dtype = _subshape(buf, shape_span, shape_index)
        is_param, pnum, pidx, live_out, is_const, thread_local = alloc_info.get(
            alloc_of[i], (False, None, (), False, False, False))
        start, end = b_start[i], b_end[i]
        if alloc_of[i] in alloc_info and (is_param or live_out or is_const) and not thread_local:
            start, end = 0, last
        buffers.append(Buffer(
            id=ids[i], size=sizes[i], instruction=name, shape_index=shape_index, shape=shape, dtype=dtype,
            opcode=opcode, op_name=op_name, allocation=alloc_of[i],
            module_path=paths[op_name] if op_name in paths else paths.setdefault(op_name, module_path(op_name)),
            offset=offset_of[i], is_parameter=is_param, parameter_number=pnum, parameter_shape_index=pidx,
            live_out=live_out, is_constant=is_const, start=int(start), end=int(end),
            is_backward=_is_backward(op_name), computation=cname,
            collective=opcode in _COLLECTIVES or wrapped in _COLLECTIVES, is_thread_local=thread_local,
        ))
        if is_param and opcode == "parameter" and _is_float(dtype):
            arg = pidx[0] if pidx else pnum
            param_shapes[shape] = param_shapes.get(shape, ()) + (arg,)

    backward_start, backward_end = _backward_span(buffers, kinds, who)

    peak_index = int(np.argmax(timeline))
    return BufferAssignment(
        buffers=tuple(buffers), timeline=timeline, peak_bytes=int(timeline[peak_index]), peak_index=peak_index,
        module_name=module_name, owner=owner, traces=tuple(traces), owner_start=o_start, owner_end=o_end,
        backward_start=backward_start, backward_end=backward_end, param_shapes=param_shapes,
    )


def _backward_span(buffers: list[Buffer], kinds: list[int], who: list[int]) -> tuple[int | None, int | None]:
    """The timeline indices where the backward pass begins and where it allocates last.

    XLA's schedule interleaves a little (a gradient accumulator zeroed early, a forward op sunk
    late), so this is not the first backward allocation: it is the split that puts the most
    forward allocations (``jvp(`` in op_name) before it and backward ones (``transpose(``) at or
    after it.
    """
    fwd = np.zeros(len(kinds) + 1, np.int64)
    bwd = np.zeros(len(kinds) + 1, np.int64)
    for k in range(len(kinds)):
        if kinds[k] == _FREE:
            continue
        name = buffers[who[k]].op_name
        if "transpose(" in name:
            bwd[k + 1] = 1
        elif "jvp(" in name:
            fwd[k + 1] = 1
    if not bwd.any():
        return None, None
    # score[t] = forward allocations at indices < t + backward allocations at indices >= t
    fwd_before = np.concatenate(([0], np.cumsum(fwd)[:-1]))
    bwd_from = bwd[::-1].cumsum()[::-1]
    return int(np.argmax(fwd_before + bwd_from)), int(np.flatnonzero(bwd)[-1])


def _simulate(sizes: np.ndarray, static_roots: list[int], kinds: list[int], who: list[int], canon: list[int]):
    """XLA's ComputePeakMemory replayed, with who holds the bytes when.

    Returns the timeline (len(events) + 1), the ownership spans (owner buffer position,
    first index, last index) and each buffer's own [start, end] (-1 when never live).
    """
    n = len(sizes)
    size = sizes.tolist()
    refs = [0] * n
    under = [-1] * n                 # SHARE_WITH: the root this buffer shares
    held_since = [-1] * n            # root buffers: timeline index its bytes began to count
    own_b: list[int] = []
    own_s: list[int] = []
    own_e: list[int] = []
    b_start = [-1] * n
    b_end = [-1] * n

    memory = 0
    for i in static_roots:
        refs[i] += 1
        if refs[i] == 1:
            held_since[i] = 0
        memory += size[i]
    m = len(kinds)
    timeline = np.empty(m + 1, np.int64)
    timeline[0] = memory
    for k in range(m):
        t = k + 1
        kind = kinds[k]
        b = who[k]
        if kind == _ALLOC:
            refs[b] += 1
            if refs[b] == 1:
                memory += size[b]
                held_since[b] = t
            if b_start[b] < 0:
                b_start[b] = t
        elif kind == _FREE:
            root = b
            while under[root] >= 0:
                root = under[root]
            under[b] = -1
            refs[root] -= 1
            if refs[root] == 0:
                memory -= size[root]
                own_b.append(root)
                own_s.append(held_since[root])
                own_e.append(t - 1)
                held_since[root] = -1
            b_end[b] = t - 1
        elif kind == _SHARE_WITH:
            root = canon[k]
            while under[root] >= 0:
                root = under[root]
            under[b] = root
            refs[root] += 1
            if refs[root] == 1:
                memory += size[root]
                held_since[root] = t
            if b_start[b] < 0:
                b_start[b] = t
        timeline[t] = memory
    for i in range(n):               # still held at the end: static and live-out bytes
        if refs[i] > 0 and held_since[i] >= 0:
            own_b.append(i)
            own_s.append(held_since[i])
            own_e.append(m)
    for i in range(n):
        if b_start[i] >= 0 and b_end[i] < b_start[i]:
            b_end[i] = m
    as_arr = lambda x: np.asarray(x, np.int64)  # noqa: E731
    return timeline, as_arr(own_b), as_arr(own_s), as_arr(own_e), b_start, b_end
