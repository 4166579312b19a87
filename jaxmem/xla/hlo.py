"""The optimized module and buffer assignment of a serialized ``xla.HloProto``, decoded into
:class:`jaxmem.xla.buffers.BufferAssignment` (every logical buffer with its instruction, shape,
op_name, allocation and live range, and XLA's memory curve).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jaxmem.xla import opnames, provenance, wire
from jaxmem.xla import timeline as timeline_mod
from jaxmem.xla.buffers import Buffer, BufferAssignment, slice_paths
from jaxmem.xla.categories import is_float
from jaxmem.xla.memory_stats import HOST_MEMORY_SPACE

# Field numbers (xla/service/hlo.proto, xla/xla_data.proto).
_HLO_PROTO = frozenset({1, 3})                 # hlo_module, buffer_assignment
_MODULE = frozenset({1, 3, 6})                 # name, computations, entry_computation_id
_COMPUTATION = frozenset({1, 2, 5, 6})         # name, instructions, id, root_id
_INSTRUCTION = frozenset({1, 2, 3, 7, 35, 36, 38})  # name, opcode, shape, metadata, id, operand_ids,
                                                    # called_computation_ids
_SHAPE = frozenset({2, 3, 4})                  # element_type, dimensions, tuple_shapes
_ASSIGNMENT = frozenset({1, 3, 4})             # logical_buffers, buffer_allocations, heap_simulator_traces
_LOGICAL = frozenset({1, 2, 3})                # id, size, defined_at
_LOCATION = frozenset({3, 4})                  # shape_index, instruction_id
_ALLOCATION = frozenset({1, 2, 3, 5, 6, 7, 8, 9, 10, 12})
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
    f = wire.fields(buf, span[0], span[1], _SHAPE)
    for i in index:
        tuples = f.get(4)
        if not tuples or i >= len(tuples):
            break
        s, e = tuples[i]
        f = wire.fields(buf, s, e, _SHAPE)
    et = wire.integer(f.get(2))
    return tuple(wire.packed(buf, f.get(3))), _DTYPES.get(et, f"type{et}")


# --------------------------------------------------------------------------------------------
# Names: what the op_name metadata says about a buffer.
# --------------------------------------------------------------------------------------------



def decode_hlo_proto(data: bytes) -> BufferAssignment:
    """Decode a serialized ``xla.HloProto`` (optimized module + buffer assignment)."""
    buf = bytes(data)
    top = wire.fields(buf, 0, len(buf), _HLO_PROTO)
    if 3 not in top:
        raise ValueError("this HloProto has no buffer_assignment (dump the after-optimizations module)")
    s, e = top[3][-1]
    module = None
    if 1 in top:
        ms, me = top[1][-1]
        module = wire.fields(buf, ms, me, _MODULE)
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
        comp = wire.fields(buf, s, e, _COMPUTATION)
        comps[wire.integer(comp.get(5))] = comp
    out: dict[int, tuple] = {}
    calls: list[tuple[int, int]] = []    # (async-start id, called computation id)
    follows: list[tuple[int, int]] = []  # (async-update / -done id, its async-start operand id)
    done: set[int] = set()

    def read(cid: int) -> None:
        comp = comps.get(cid)
        if comp is None or cid in done:
            return
        done.add(cid)
        cname = wire.string(buf, comp.get(1))
        for a, b in comp.get(2, ()):
            ins = wire.fields(buf, a, b, _INSTRUCTION)
            opcode = wire.string(buf, ins.get(2))
            op_name = provenance.instruction_op_name(buf, ins)
            iid = wire.integer(ins.get(35))
            shape = ins.get(3)
            out[iid] = (wire.string(buf, ins.get(1)), opcode, shape[-1] if shape else None, op_name, cname, "")
            if opcode in opnames.ASYNC:
                if 38 in ins:
                    calls.append((iid, wire.packed(buf, ins[38])[0]))
                elif 36 in ins:
                    follows.append((iid, wire.packed(buf, ins[36])[0]))

    for cid in sorted({i >> 32 for i in needed}):
        read(cid)
    if not needed.issubset(out):
        for cid in comps:
            read(cid)
    for iid, cid in calls:           # async-start/-done: what they wrap (a collective?)
        called = comps.get(cid)
        if called is None or 6 not in called:
            continue
        root = wire.integer(called[6])
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
    ba = wire.fields(buf, s, e, _ASSIGNMENT)
    ids, sizes, where = _logical_buffers(buf, ba)
    index_of = {bid: i for i, bid in enumerate(ids)}
    module_name = wire.string(buf, module.get(1)) if module else ""
    instructions = _instructions(buf, module, {w[0] for w in where if w[0] >= 0}) if module else {}
    al = _allocations(buf, ba, index_of, sizes)
    kinds, who, canon, traces, every = _events(buf, ba, index_of, al.on_host)

    timeline, owner, o_start, o_end, b_start, b_end = timeline_mod.simulate(np.asarray(sizes, np.int64),
                                                                            al.static_roots, kinds, who, canon)
    buffers, param_shapes = _buffers(buf, ids, sizes, where, instructions, al, b_start, b_end, len(timeline) - 1)
    if module:   # buffers XLA made without a name, and a scan's scaffolding: the module of the value held
        graph = provenance.read_graph(buf, module)
        paths = provenance.refine([b.module_path for b in buffers], where, graph,
                                  [b.is_parameter or b.is_constant for b in buffers])
        buffers = [b if p == b.module_path else dataclasses.replace(b, module_path=p) for b, p in zip(buffers, paths,
                                                                                                       strict=True)]
        # a collective's data, followed back to the argument it is (a gathered parameter) or -1 (computed)
        buffers = [_with_source(b, graph, w) if b.collective and w[0] >= 0 else b
                   for b, w in zip(buffers, where, strict=True)]
    backward_start, backward_end = timeline_mod.backward_span(buffers, kinds, who)

    peak_index = int(np.argmax(timeline))
    xla_peak = -1
    if al.on_host:   # XLA's peak_memory_in_bytes replays the host allocations' heap too, chained after the device's
        xla_peak = int(timeline_mod.simulate(np.asarray(sizes, np.int64), al.static_roots + al.host_roots,
                                             [e[0] for e in every], [e[1] for e in every],
                                             [e[2] for e in every])[0].max())
    return BufferAssignment(
        buffers=tuple(slice_paths(buffers)), timeline=timeline, peak_bytes=int(timeline[peak_index]),
        peak_index=peak_index,
        module_name=module_name, owner=owner, traces=tuple(traces), owner_start=o_start, owner_end=o_end,
        backward_start=backward_start, backward_end=backward_end, param_shapes=param_shapes, xla_peak_bytes=xla_peak,
    )


def _with_source(b: Buffer, graph: provenance.Graph, where: tuple[int, tuple[int, ...]]) -> Buffer:
    """A collective's buffer with the argument its data is (provenance.Graph.argument)."""
    argument, scanned = graph.argument(*where)
    return dataclasses.replace(b, source_argument=argument, source_scanned=scanned)


def _logical_buffers(buf: bytes, ba: dict) -> tuple[list[int], list[int], list[tuple[int, tuple[int, ...]]]]:
    """Logical buffers, in proto order: ids, sizes, (instruction id, shape index)."""
    ids: list[int] = []
    sizes: list[int] = []
    where: list[tuple[int, tuple[int, ...]]] = []
    for a, b in ba.get(1, ()):
        lb = wire.fields(buf, a, b, _LOGICAL)
        ids.append(wire.integer(lb.get(1)))
        sizes.append(wire.integer(lb.get(2)))
        loc = lb.get(3)
        if loc:
            la, lz = loc[-1]
            lf = wire.fields(buf, la, lz, _LOCATION)
            where.append((wire.integer(lf.get(4), -1), tuple(wire.packed(buf, lf.get(3)))))
        else:
            where.append((-1, ()))
    return ids, sizes, where


@dataclasses.dataclass
class _Allocations:
    """Which buffer sits where, and which allocations live for the whole program."""

    alloc_of: list[int]
    offset_of: list[int]
    info: dict[int, tuple]                 # allocation -> (is_param, number, index, live_out, is_const, thread_local)
    static_roots: list[int]                # buffer positions holding one static reference each
    host_roots: list[int]                  # ... of host allocations (in XLA's own peak only)
    on_host: set[int]                      # buffer positions in pinned host memory (their own heap)


def _allocations(buf: bytes, ba: dict, index_of: dict[int, int], sizes: list[int]) -> _Allocations:
    n = len(sizes)
    out = _Allocations([-1] * n, [0] * n, {}, [], [], set())
    for a, b in ba.get(3, ()):
        al = wire.fields(buf, a, b, _ALLOCATION)
        index = wire.integer(al.get(1))
        host = wire.integer(al.get(8)) == HOST_MEMORY_SPACE
        thread_local = bool(wire.integer(al.get(3)))
        is_param = bool(wire.integer(al.get(5)))
        live_out = bool(wire.integer(al.get(7)))
        is_const = bool(wire.integer(al.get(12)))
        out.info[index] = (is_param, wire.integer(al.get(6)) if is_param else None,
                           tuple(wire.packed(buf, al.get(10))), live_out, is_const, thread_local)
        largest, largest_size = -1, 0
        for x, y in al.get(9, ()):
            asg = wire.fields(buf, x, y, _ASSIGNED)
            i = index_of.get(wire.integer(asg.get(1)))
            if i is None:
                continue
            out.alloc_of[i] = index
            out.offset_of[i] = wire.integer(asg.get(2))
            if host:
                out.on_host.add(i)
            if sizes[i] > largest_size:
                largest, largest_size = i, sizes[i]
        if not thread_local and (is_param or is_const or live_out) and largest >= 0:
            (out.host_roots if host else out.static_roots).append(largest)
    return out


def _events(buf: bytes, ba: dict, index_of: dict[int, int], on_host: set[int]):
    """Heap-simulator events of all traces, chained in proto order: the device's (kinds, who, canon),
    each trace's first event, and every event with the host buffers' too (XLA's own peak)."""
    kinds: list[int] = []
    who: list[int] = []
    canon: list[int] = []
    traces: list[int] = []
    every: list[tuple[int, int, int]] = []
    for a, b in ba.get(4, ()):
        tr = wire.fields(buf, a, b, _TRACE)
        traces.append(len(kinds) + 1)
        for x, y in tr.get(1, ()):
            ev = wire.fields(buf, x, y, _EVENT)
            kind = wire.integer(ev.get(1))
            try:
                event = (kind, index_of[wire.integer(ev.get(2))],
                         index_of[wire.integer(ev.get(5))] if kind == _SHARE_WITH else -1)
            except KeyError as e:
                raise ValueError(f"heap-simulator event names logical buffer {e.args[0]}, which the "
                                 "assignment does not define") from None
            every.append(event)
            if event[1] in on_host:
                continue   # the device's memory curve: host buffers (offloaded state, activations) are not on it
            kinds.append(kind)
            who.append(event[1])
            canon.append(event[2])
    return kinds, who, canon, traces, every


def _buffers(buf: bytes, ids, sizes, where, instructions, al: _Allocations, b_start, b_end,
             last: int) -> tuple[list[Buffer], dict]:
    """Each logical buffer with its instruction, shape, allocation and live range; the float
    parameters' argument indices by shape."""
    buffers: list[Buffer] = []
    param_shapes: dict = {}
    paths: dict[str, str] = {}
    for i in range(len(ids)):
        iid, shape_index = where[i]
        name, opcode, shape_span, op_name, cname, wrapped = instructions.get(iid, ("", "", None, "", "", ""))
        shape, dtype = _subshape(buf, shape_span, shape_index)
        is_param, pnum, pidx, live_out, is_const, thread_local = al.info.get(
            al.alloc_of[i], (False, None, (), False, False, False))
        start, end = b_start[i], b_end[i]
        if al.alloc_of[i] in al.info and (is_param or live_out or is_const) and not thread_local \
                and i not in al.on_host:
            start, end = 0, last
        buffers.append(Buffer(
            id=ids[i], size=sizes[i], instruction=name, shape_index=shape_index, shape=shape, dtype=dtype,
            opcode=opcode, op_name=op_name, allocation=al.alloc_of[i],
            module_path=paths[op_name] if op_name in paths else paths.setdefault(op_name, opnames.module_path(op_name)),
            offset=al.offset_of[i], is_parameter=is_param, parameter_number=pnum, parameter_shape_index=pidx,
            live_out=live_out, is_constant=is_const, start=int(start), end=int(end),
            is_backward=opnames.is_backward(op_name), computation=cname,
            collective=opcode in opnames.COLLECTIVES or wrapped in opnames.COLLECTIVES, is_thread_local=thread_local,
        ))
        if is_param and opcode == "parameter" and is_float(dtype):
            param_shapes[shape] = param_shapes.get(shape, ()) + (buffers[-1].argument_index,)
    return buffers, param_shapes


