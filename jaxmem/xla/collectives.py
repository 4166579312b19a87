"""The collectives of a compiled program, read from its optimized HLO text.

    collectives(compiled.as_text(), mesh_axes=(("data", 8),)) -> [Collective, ...]

One :class:`Collective` per collective instruction of the per-device program (the
``-start`` of an async pair; ``-done`` adds nothing): its kind (``all-gather``,
``reduce-scatter``, ``all-reduce``, ``all-to-all``, ``collective-permute``,
``collective-broadcast``, ``ragged-all-to-all``), the bytes it works on per device, its
replica groups as global device ids, the mesh axes those groups span, and how many times
it runs per step (``count_in_loop``: the trip count of the loops around it; a weight
all-gather in the layer loop of a 32-layer scanned model runs 32 times).

``bytes`` is the size of the full buffer on one device: the gathered result of an
all-gather, the input (before scattering) of a reduce-scatter, the buffer of an
all-reduce, all-to-all or collective-permute. What goes over the wire follows from it
(see :mod:`jaxmem.compiler.steptime`).

Device ids: jax compiles a program over a mesh with the mesh's devices, flattened in
row-major order, as its device assignment, so global device id ``i`` is the mesh
position ``numpy.unravel_index(i, mesh_shape)``. A group spans an axis when its members'
coordinates differ along it. XLA prints replica groups in three forms, all read here:
explicit lists ``{{0,1},{2,3}}``, iota tiles ``[2,4]<=[4,2]T(1,0)``, and named-mesh
groups ``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`` (XLA's own axis names, which need not
match the user's: they are resolved through the device ids).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from jaxmem.xla import hlo_text

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute",
         "collective-broadcast", "ragged-all-to-all")
# opcode -> kind. Async pairs are counted once, at their start.
_OPCODES = {**{k: k for k in KINDS}, **{f"{k}-start": k for k in KINDS}}


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str                                   # one of KINDS
    bytes: int                                  # per device, see the module docstring
    replica_groups: tuple[tuple[int, ...], ...]  # global device ids; for collective-permute the (source, target) pairs
    axes: tuple[str, ...]                       # mesh axes the groups span (empty: a no-op group of one device)
    count_in_loop: int                          # executions per step (product of enclosing loops' trip counts)
    name: str = ""                              # the HLO instruction
    computation: str = ""                       # the HLO computation holding it (a loop body, the entry...)

    @property
    def group_size(self) -> int:
        return max((len(g) for g in self.replica_groups), default=1)

    @property
    def bytes_per_step(self) -> int:
        return self.bytes * self.count_in_loop


def collectives(hlo_text_or_module: str | hlo_text.Module, mesh_axes: Sequence[tuple[str, int]]) -> list[Collective]:
    """Every collective of the optimized HLO (``compiled.as_text()``), in program text order.

    `mesh_axes`: the mesh the program was compiled for, as ``(name, size)`` pairs in mesh
    order, e.g. ``(("data", 4), ("model", 2))``.
    """
    module = (hlo_text_or_module if isinstance(hlo_text_or_module, hlo_text.Module)
              else hlo_text.parse_module(hlo_text_or_module))
    names = tuple(n for n, _ in mesh_axes)
    shape = tuple(int(s) for _, s in mesh_axes) or (1,)
    n_devices = int(np.prod(shape))
    mult = module.multiplicity
    out = []
    for comp in module.computations.values():
        if comp.name not in mult:        # dead code: never runs
            continue
        for ins in comp.instructions:
            kind, wrapped = _kind(module, ins)
            if kind is None:
                continue
            src = wrapped or ins
            groups = _groups(src, n_devices)
            out.append(Collective(
                kind=kind, bytes=_bytes(kind, ins, src, groups), replica_groups=groups,
                axes=_axes(groups, names, shape), count_in_loop=mult[comp.name], name=ins.name,
                computation=comp.name,
            ))
    return out


def _kind(module: hlo_text.Module, ins: hlo_text.Instruction):
    """(kind, the instruction holding the attributes) for a collective, else (None, None)."""
    if ins.opcode in _OPCODES:
        return _OPCODES[ins.opcode], None
    if ins.opcode == "async-start":  # a collective wrapped in an async computation
        for _, callee in ins.called:
            comp = module.computations.get(callee)
            for inner in comp.instructions if comp else ():
                if inner.opcode in KINDS:
                    return inner.opcode, inner
    return None, None


def _bytes(kind: str, ins: hlo_text.Instruction, src: hlo_text.Instruction, groups) -> int:
    shape = ins.shape
    if ins.opcode.endswith("-start") or ins.opcode == "async-start":
        # async starts return (operands, results[, scratch...]): the results are element 1
        shape = shape[1] if isinstance(shape, tuple) and len(shape) > 1 else shape
        if ins.opcode == "async-start":
            shape = src.shape
    size = hlo_text.shape_bytes(shape)
    if kind == "reduce-scatter":
        n = max((len(g) for g in groups), default=1)
        size *= n  # the result is one of n pieces of the input
    return size


_IOTA = re.compile(r"^\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
# mesh['a'=4,'b'=2] {'a'}, or with the mesh's devices permuted (HSDP's meshes):
# mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) {'a'} (an iota, reshaped, transposed) or device_ids={0,2,...}
_MESH = re.compile(r"^mesh\[([^\]]*)\]\s*(?:,\s*device_ids=(\(\[[\d,]+\](?:T\([\d,]+\))?\)|\{[\d,\s]*\}))?\s*"
                   r"\{([^}]*)\}")
_DEVICE_IOTA = re.compile(r"^\(\[([\d,]+)\](?:T\(([\d,]+)\))?\)$")


def _groups(ins: hlo_text.Instruction, n_devices: int) -> tuple[tuple[int, ...], ...]:
    if ins.opcode.startswith("collective-permute"):
        pairs = ins.attr("source_target_pairs") or "{}"
        return tuple(tuple(int(x) for x in re.findall(r"\d+", p)) for p in re.findall(r"\{([\d,\s]+)\}", pairs))
    text = ins.attr("replica_groups")
    if text is None or text.strip() in ("{}", ""):
        return (tuple(range(n_devices)),)  # no groups: all devices together
    text = text.strip()
    if text.startswith("mesh[") and "{" not in text and ins.attr("device_ids"):
        # the attribute reader stops at the comma: the mesh's device_ids and spanned axes follow it
        text = f"{text}, device_ids={ins.attr('device_ids')}"
    m = _IOTA.match(text)
    if m:
        out_shape = [int(x) for x in m.group(1).split(",")]
        reshape = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(int(np.prod(reshape))).reshape(reshape)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        ids = ids.reshape(out_shape)
        return tuple(tuple(int(x) for x in row) for row in ids.reshape(out_shape[0], -1))
    m = _MESH.match(text)
    if m:
        axes = [(a.strip().strip("'"), int(s)) for a, s in re.findall(r"([^,=]+)=(\d+)", m.group(1))]
        spanned = {a.strip().strip("'") for a in m.group(3).split(",") if a.strip()}
        sizes = [s for _, s in axes]
        ids = _mesh_devices(m.group(2), int(np.prod(sizes))).reshape(sizes)
        inner = [i for i, (a, _) in enumerate(axes) if a in spanned]
        outer = [i for i in range(len(axes)) if i not in inner]
        ids = ids.transpose(outer + inner).reshape(-1, int(np.prod([sizes[i] for i in inner])) if inner else 1)
        return tuple(tuple(int(x) for x in row) for row in ids)
    groups = re.findall(r"\{([\d,\s]*)\}", text)
    return tuple(tuple(int(x) for x in re.findall(r"\d+", g)) for g in groups if g.strip())


def _mesh_devices(device_ids: str | None, n: int) -> np.ndarray:
    """The device ids of a mesh replica-group's mesh, in mesh order: 0..n-1, or its device_ids
    (an iota reshaped and transposed, or a list)."""
    if not device_ids:
        return np.arange(n)
    m = _DEVICE_IOTA.match(device_ids)
    if m:
        dims = [int(x) for x in m.group(1).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(2):
            ids = ids.transpose([int(x) for x in m.group(2).split(",")])
        return ids.reshape(-1)
    return np.array([int(x) for x in re.findall(r"\d+", device_ids)])


def _axes(groups, names: tuple[str, ...], shape: tuple[int, ...]) -> tuple[str, ...]:
    """The mesh axes along which the members of some group differ."""
    n = int(np.prod(shape))
    spanned = np.zeros(len(shape), bool)
    for g in groups:
        ids = [d for d in g if d < n]
        if len(ids) < 2:
            continue
        coords = np.array(np.unravel_index(ids, shape))  # (axes, members)
        spanned |= (coords != coords[:, :1]).any(axis=1)
    return tuple(name for name, s in zip(names, spanned, strict=True) if s)
