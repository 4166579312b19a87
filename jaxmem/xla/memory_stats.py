"""XLA's per-device memory numbers (``compiled.memory_analysis()``), recomputed from a dumped
buffer assignment, so that a compile can be stopped once the buffer assignment exists
(:mod:`jaxmem.compiler.early_stop`).

PJRT fills ``CompiledMemoryStats`` from the executable's buffer allocations
(``CompiledMemoryStats::PopulateBufferStatsFromAllocations``, xla/pjrt/pjrt_executable.cc):

* an entry-parameter allocation counts in ``argument``, and in ``alias`` when the module's
  input/output alias config lists that parameter (a donated argument);
* a maybe-live-out allocation counts in ``output``;
* every other allocation that is neither thread-local nor a constant is ``temp``;
* each in the ``host_*`` twin when its memory space (the allocation's color under XLA's default
  colorer) is host memory (``--offload``).

The peak is XLA's ``ComputePeakMemory`` over the same proto, which the decoded memory curve
replays exactly (:mod:`jaxmem.xla.timeline`). tests/test_early_stop.py compiles shipped models
both ways and asserts every number equal.
"""

from __future__ import annotations

from jaxmem.xla import wire

_HLO_PROTO = frozenset({1, 3})          # hlo_module, buffer_assignment
_MODULE = frozenset({8})                # input_output_alias
_ALIAS_CONFIG = frozenset({1})          # entries
_ALIAS_ENTRY = frozenset({2, 3})        # parameter_number, parameter_shape_index
_ASSIGNMENT = frozenset({3})            # buffer_allocations
# index, size, is_thread_local, is_entry_computation_parameter, parameter_number, maybe_live_out,
# color, parameter_shape_index, is_constant
_ALLOCATION = frozenset({1, 2, 3, 5, 6, 7, 8, 10, 12})

HOST_MEMORY_SPACE = 5   # xla::Layout::kHostMemorySpace

NUMBERS = ("argument", "output", "alias", "temp", "host_argument", "host_output", "host_alias", "host_temp")


def split_hlo_proto(data: bytes) -> tuple[bytes, bytes]:
    """(HloModuleProto, BufferAssignmentProto) of a serialized ``xla.HloProto``.

    Strict: the message must parse to its last byte and hold both, which is also how a dump that
    is still being written is told from a finished one."""
    buf = bytes(data)
    top = wire.fields(buf, 0, len(buf), _HLO_PROTO)
    if 1 not in top or 3 not in top:
        raise ValueError("this HloProto lacks its module or its buffer assignment")
    (ms, me), (bs, be) = top[1][-1], top[3][-1]
    if max(me, be) != len(buf):
        raise ValueError("this HloProto does not end where its last field does")
    return buf[ms:me], buf[bs:be]


def from_hlo_proto(data: bytes) -> dict[str, int]:
    """XLA's memory numbers (bytes, keys :data:`NUMBERS`) for the after-optimizations ``HloProto``."""
    module, assignment = split_hlo_proto(data)
    aliased: set[tuple[int, tuple[int, ...]]] = set()
    mod = wire.fields(module, 0, len(module), _MODULE)
    for cs, ce in mod.get(8, ()):
        for es, ee in wire.fields(module, cs, ce, _ALIAS_CONFIG).get(1, ()):
            entry = wire.fields(module, es, ee, _ALIAS_ENTRY)
            aliased.add((wire.integer(entry.get(2)), tuple(wire.packed(module, entry.get(3)))))
    out = dict.fromkeys(NUMBERS, 0)
    ba = wire.fields(assignment, 0, len(assignment), _ASSIGNMENT)
    for s, e in ba.get(3, ()):
        al = wire.fields(assignment, s, e, _ALLOCATION)
        size = wire.integer(al.get(2))
        host = "host_" if wire.integer(al.get(8)) == HOST_MEMORY_SPACE else ""
        is_param = bool(wire.integer(al.get(5)))
        live_out = bool(wire.integer(al.get(7)))
        if is_param:
            out[host + "argument"] += size
            if (wire.integer(al.get(6)), tuple(wire.packed(assignment, al.get(10)))) in aliased:
                out[host + "alias"] += size
        if live_out:
            out[host + "output"] += size
        if not (is_param or live_out or wire.integer(al.get(3)) or wire.integer(al.get(12))):
            out[host + "temp"] += size
    return out


def constant_bytes(data: bytes) -> int:
    """Device bytes of the constants XLA keeps for the program (its ``is_constant`` allocations: a
    table the step closed over that XLA could not slice away). PJRT's numbers leave them out of
    ``temp``; XLA:GPU counts them in ``generated_code`` (``GpuExecutable::SizeOfGeneratedCodeInBytes``:
    the cubin plus the constants), which neither a compile-only executable nor a compile stopped at
    buffer assignment has. XLA's peak (the memory curve's static part) holds them."""
    _, assignment = split_hlo_proto(data)
    total = 0
    ba = wire.fields(assignment, 0, len(assignment), _ASSIGNMENT)
    for s, e in ba.get(3, ()):
        al = wire.fields(assignment, s, e, _ALLOCATION)
        if (wire.integer(al.get(12)) and not wire.integer(al.get(3))
                and wire.integer(al.get(8)) != HOST_MEMORY_SPACE):
            total += wire.integer(al.get(2))
    return total
