"""XLA's buffer assignment as jaxmem reads it: every logical buffer, where it lives, and memory over time.

XLA writes the optimized module and its buffer assignment as one ``xla.HloProto`` when a
compile is given the dump options of :func:`jaxmem.xla.dump.compile_options`; for a deviceless
GPU compile this dump is the only way to get them (``memory_analysis()``'s
``serialized_buffer_assignment_proto`` is empty through the PJRT C API). The pieces:

- :mod:`jaxmem.xla.wire`: the protobuf wire format;
- :mod:`jaxmem.xla.hlo`: the HloProto decoded into the types below;
- :mod:`jaxmem.xla.opnames`: op_name metadata -> Flax module paths;
- :mod:`jaxmem.xla.provenance`: the module of a buffer XLA made without a name (a scan's stacks, their
  copies), followed through the program's graph;
- :mod:`jaxmem.xla.timeline`: XLA's ``ComputePeakMemory`` replayed (the memory curve);
- :mod:`jaxmem.xla.categories`: params / gradients / activations / ... per buffer;
- :mod:`jaxmem.xla.dump`: the compile options that make XLA dump, and reading the dump.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from jaxmem.xla.categories import CATEGORIES, categorize


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
    # a collective's: the flat argument index of the step's argument whose data it gathers or reduces
    # (moved, cast, sliced; jaxmem.xla.provenance.Graph.argument), -1 where that data is computed
    source_argument: int = -1
    source_scanned: bool = False   # ... one iteration's slice of a stack a loop carries: a scanned layer's

    @property
    def argument_index(self) -> int:
        """The flat argument index of an entry parameter's buffer: the parameter number, or, when
        XLA passes all arguments as one tuple parameter, the first element of the shape index."""
        if self.parameter_shape_index:
            return self.parameter_shape_index[0]
        return self.parameter_number or 0


@dataclass(frozen=True, eq=False)   # holds arrays: compared by identity
class BufferAssignment:
    """All logical buffers and XLA's memory curve (see the module docstring for how it is built).

    ``timeline[0]`` is the memory before the first heap event (entry parameters, constants,
    live-out allocations); ``timeline[i]`` for ``i >= 1`` is the memory after the ``i``-th event.
    ``peak_bytes == timeline.max() == memory_analysis().peak_memory_in_bytes`` -- except where
    buffers live in pinned host memory: the timeline is the device's alone, while XLA chains the
    host allocations' heap simulation after the device's into its number (``xla_peak_bytes``).
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
    xla_peak_bytes: int = -1             # memory_analysis().peak_memory_in_bytes (host buffers too); -1: peak_bytes

    @property
    def xla_peak(self) -> int:
        return self.peak_bytes if self.xla_peak_bytes < 0 else self.xla_peak_bytes

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
            cat = categorize(b, param_categories, assignment=self)
            out[cat] = out.get(cat, 0) + b.size   # "constants" only where XLA keeps one
        return out


def slice_paths(buffers: list[Buffer]) -> list[Buffer]:
    """A loop's inputs that XLA made without a scope (the zero-initialized stack of a scan's outputs:
    ``broadcast.90``, no op_name) take the module path of the while loop they are carried by: a loop's
    state shares its operands' memory, and the loop is named for the module scanned (nn.scan's, or
    nnx.scan's through jaxmem's scope). Only values made before that loop, in the same slice, without
    an op_name path of their own; a slice reused by unrelated buffers keeps them unnamed."""
    loops: dict[tuple[int, int, int], list[Buffer]] = {}
    for b in buffers:
        # a loop named for a module inside the model (a root-only path says no more than "the model")
        if b.opcode == "while" and "/" in b.module_path and not b.is_parameter:
            loops.setdefault((b.allocation, b.offset, b.size), []).append(b)
    out = []
    for b in buffers:
        if not b.module_path and not b.is_parameter and "/" not in b.op_name and b.opcode != "parameter":
            carriers = [w for w in loops.get((b.allocation, b.offset, b.size), ()) if b.start < w.start]
            if carriers:
                b = replace(b, module_path=min(carriers, key=lambda w: w.start).module_path)
        out.append(b)
    return out
