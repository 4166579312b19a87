"""Named sharding layouts -> a PartitionSpec for every leaf of the train state.

Mesh axes play one of two roles: the *model* axis (named ``model``, ``tensor`` or
``tp``) carries tensor parallelism; every other axis is a *data* axis (the batch is
split over all of them, and FSDP shards the state over them).

Layouts (ZeRO / Megatron terms):

* ``dp``: state replicated, batch sharded over the data axes.
* ``fsdp``: params, gradients and optimizer state sharded over the data axes
  (ZeRO-3): each leaf's ``embed`` dimension when annotated, else its largest
  dimension that the data axes divide.
* ``tp``: params sharded over the model axis by their logical axis names
  (``mlp``, ``heads``, ``kv_heads``, ``vocab`` -> model; everything else
  replicated: Megatron's column/row split). Unannotated leaves fall back to the
  FSDP rule on the model axis (largest divisible dimension of 2-D+ leaves).
* ``fsdp_tp``: both, on different dimensions of the same leaf.

A dimension that cannot be split as asked stays replicated and is reported, with
its byte cost, as a :class:`ShardingIssue`. The scan axis ``layers`` is never split.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

from jaxmem.errors import UserError
from jaxmem.program.options import LAYOUTS

MODEL_AXIS_NAMES = ("model", "tensor", "tp")

# Logical name -> role. Megatron: column-parallel on the expanded dim (mlp, heads),
# row-parallel layers then share the same name on their input dim.
DEFAULT_TP_RULES: dict[str, str | None] = {
    "mlp": "model", "heads": "model", "q_heads": "model", "kv_heads": "model",
    "vocab": "model", "experts": None, "embed": None, "head_dim": None, "kv": None,
    "layers": None, "norm": None,
}
FSDP_PREFERRED = ("embed", "mlp", "vocab")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    axes: tuple[tuple[str, int], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def model_axis(self) -> str | None:
        for n in self.names:
            if n in MODEL_AXIS_NAMES:
                return n
        return None

    @property
    def data_axes(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n != self.model_axis)

    def axis_size(self, axes: str | tuple[str, ...] | None) -> int:
        if axes is None:
            return 1
        if isinstance(axes, str):
            axes = (axes,)
        d = dict(self.axes)
        return math.prod(d[a] for a in axes)

    @property
    def data_size(self) -> int:
        return self.axis_size(self.data_axes)

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in self.axes)


def parse_mesh(text: str) -> MeshSpec:
    """`data=4,model=2` -> MeshSpec; order is the device-grid order."""
    axes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)", part)
        if not m:
            raise UserError(f"--mesh {text!r}: expected AXIS=N[,AXIS=N], e.g. data=8 or data=4,model=2")
        name, size = m.group(1), int(m.group(2))
        if size < 1:
            raise UserError(f"--mesh {text!r}: axis {name} must have at least 1 device")
        if name in (a for a, _ in axes):
            raise UserError(f"--mesh {text!r}: axis {name} given twice")
        axes.append((name, size))
    if not axes:
        raise UserError("--mesh is empty; e.g. --mesh data=8")
    return MeshSpec(tuple(axes))


def build_mesh(devices, mesh: MeshSpec):
    """The jax Mesh for `mesh` over the first devices, in order: one rule for the
    compile-only devices analyze predicts on and the local ones verify measures on."""
    import numpy as np
    from jax.sharding import Mesh

    if len(devices) < mesh.size:
        raise UserError(f"the mesh {mesh} needs {mesh.size} devices; there are {len(devices)}")
    return Mesh(np.array(list(devices)[: mesh.size], dtype=object).reshape(mesh.shape), mesh.names)


@dataclasses.dataclass(frozen=True)
class ShardingIssue:
    """A leaf dimension that could not be sharded as the layout asked."""

    leaf: str
    shape: tuple[int, ...]
    axis: str
    reason: str
    replicated_bytes: int   # extra bytes per device from keeping it replicated


def check_layout(layout: str, mesh: MeshSpec) -> None:
    if layout not in LAYOUTS:
        raise UserError(f"unknown layout {layout!r}. Known: {', '.join(LAYOUTS)}.")
    if layout in ("tp", "fsdp_tp") and mesh.model_axis is None:
        raise UserError(f"--layout {layout} needs a model axis in --mesh (e.g. --mesh data=4,model=2); got {mesh}")
    if layout in ("fsdp", "fsdp_tp") and not mesh.data_axes:
        raise UserError(f"--layout {layout} needs a data axis in --mesh (e.g. --mesh data=8); got {mesh}")


def spec_axes(axes: tuple[str, ...]):
    """A PartitionSpec entry: one axis name or a tuple of several."""
    return axes[0] if len(axes) == 1 else axes


def leaf_spec(
    path: str,
    shape: tuple[int, ...],
    itemsize: int,
    names: Sequence[str | None] | None,
    layout: str,
    mesh: MeshSpec,
    tp_rules: dict[str, str | None],
    issues: list[ShardingIssue],
) -> tuple:
    """The PartitionSpec entries (one per dim) for one state leaf."""
    spec: list[Any] = [None] * len(shape)
    if not shape or layout == "dp":
        return tuple(spec)
    nbytes = math.prod(shape) * itemsize
    names = tuple(names) if names is not None and len(names) == len(shape) else None

    if layout in ("tp", "fsdp_tp"):
        axis = mesh.model_axis
        size = mesh.axis_size(axis)
        if names is not None:
            for i, n in enumerate(names):
                if n is not None and tp_rules.get(n) == "model":
                    if shape[i] % size == 0:
                        spec[i] = axis
                    else:
                        issues.append(ShardingIssue(path, shape, axis, f"dim {i} ({n}={shape[i]}) not divisible by {axis}={size}",
                                                    nbytes - nbytes // size))
                    break  # one tensor-parallel dim per leaf
        elif len(shape) >= 2:
            _shard_largest(path, shape, nbytes, spec, names, (axis,), mesh, issues, prefer=())

    if layout in ("fsdp", "fsdp_tp"):
        _shard_largest(path, shape, nbytes // mesh.axis_size(used_axes(spec)), spec, names,
                       mesh.data_axes, mesh, issues, prefer=FSDP_PREFERRED)
    return tuple(spec)


def used_axes(spec) -> tuple[str, ...]:
    out: list[str] = []
    for s in spec:
        if s is None:
            continue
        out.extend([s] if isinstance(s, str) else s)
    return tuple(out)


def _shard_largest(path, shape, nbytes, spec, names, axes, mesh, issues, prefer) -> None:
    """Shard one free dim over `axes`: a preferred logical name first, else the largest divisible."""
    size = mesh.axis_size(axes)
    if size == 1:
        return
    free = [i for i in range(len(shape)) if spec[i] is None and not (names and names[i] == "layers")]
    candidates = [i for i in free if shape[i] % size == 0]
    if not candidates:
        if nbytes >= 1 << 16:  # biases and norm scales are replicated by every FSDP implementation
            issues.append(ShardingIssue(path, shape, "+".join(axes), f"no dimension of {shape} is divisible by {size}",
                                        nbytes - nbytes // size))
        return
    if names:
        for p in prefer:
            hit = [i for i in candidates if names[i] == p]
            if hit:
                spec[hit[0]] = spec_axes(axes)
                return
    best = max(candidates, key=lambda i: (shape[i], i))
    spec[best] = spec_axes(axes)


def batch_spec(shape: tuple[int, ...], mesh: MeshSpec, path: str):
    """Batch leaves: dim 0 split over the data axes."""
    data = mesh.data_axes
    size = mesh.axis_size(data)
    if not shape:
        return ()
    if size > 1 and shape[0] % size:
        raise UserError(
            f"batch leaf {path!r}: global batch {shape[0]} is not divisible by the {size} devices of the data "
            f"axes ({'x'.join(data)}); use a --batch that is a multiple of {size}"
        )
    return (spec_axes(data) if data and size > 1 else None,) + (None,) * (len(shape) - 1)
