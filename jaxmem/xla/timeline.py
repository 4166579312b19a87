"""XLA's memory curve, replayed from the buffer assignment's heap-simulator trace.

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
"""

from __future__ import annotations

import numpy as np

# HeapSimulatorTrace.Event.Kind
ALLOC, FREE, SHARE_WITH = 0, 1, 2


def backward_span(buffers, kinds: list[int], who: list[int]) -> tuple[int | None, int | None]:
    """The timeline indices where the backward pass begins and where it allocates last.

    XLA's schedule interleaves a little (a gradient accumulator zeroed early, a forward op sunk
    late), so this is not the first backward allocation: it is the split that puts the most
    forward allocations (``jvp(`` in op_name) before it and backward ones (``transpose(``) at or
    after it.
    """
    fwd = np.zeros(len(kinds) + 1, np.int64)
    bwd = np.zeros(len(kinds) + 1, np.int64)
    for k in range(len(kinds)):
        if kinds[k] == FREE:
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


def simulate(sizes: np.ndarray, static_roots: list[int], kinds: list[int], who: list[int], canon: list[int]):
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
        if kind == ALLOC:
            refs[b] += 1
            if refs[b] == 1:
                memory += size[b]
                held_since[b] = t
            if b_start[b] < 0:
                b_start[b] = t
        elif kind == FREE:
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
        elif kind == SHARE_WITH:
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


def downsample(curve: np.ndarray, points: int) -> tuple[int, ...]:
    """Max per bucket, so no peak is lost."""
    curve = np.asarray(curve, dtype=np.int64)
    if len(curve) <= points:
        return tuple(int(x) for x in curve)
    edges = np.linspace(0, len(curve), points + 1).astype(np.int64)
    return tuple(int(x) for x in np.maximum.reduceat(curve, edges[:-1]))


def downsampled_index(i: int, n: int, points: int) -> int:
    """Where index ``i`` of an ``n``-point curve lands in its downsampled form."""
    if n <= points:
        return i
    edges = np.linspace(0, n, points + 1).astype(np.int64)
    return int(np.searchsorted(edges, i, side="right") - 1)
