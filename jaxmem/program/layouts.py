"""Mesh axes with roles, the layouts' checks against the mesh, and the batch's PartitionSpecs.

Each mesh axis has a role, given by its name (MaxText's mesh axes; aliases in parentheses):

* ``data`` (``dp``, ``batch``): replicas: the batch split, the state replicated;
* ``fsdp``: the batch split and the state sharded (ZeRO-3); ``data`` + ``fsdp`` is HSDP;
* ``tensor`` (``model``, ``tp``): Megatron's column/row split of the weights;
* ``context`` (``sequence``, ``sp``, ``seq``): the sequence dimension of the batch and of activations split;
* ``expert`` (``ep``): the experts dimension of MoE weights split, the batch split as for data;
* ``stage`` (``pp``): pipeline stages: the stacked weights of the model's layer scan split on their layer
  dimension, the layers run as a pipeline (``pipeline_stages.py``); a workload's own step pipelines itself.

A model's own axis names (EasyDeL's ``dp, fsdp, ep, tp, sp``, tunix's ``fsdp, tp``) are the mesh's
names: the common ones above have their role without being asked; any other takes one from
``--axis-roles NAME=ROLE[,NAME=ROLE]`` (API ``axis_roles=``), so the model's parameter annotations
and rules that name those axes apply as written.

The axes that split the batch are the data, fsdp and expert axes (``batch_axes``). Which axes
split the state is the layout's rule set (``rules.py``): ``fsdp``/``fsdp_tp`` shard it over the
fsdp axes, or over the data axes on a mesh without one (what ``--mesh data=8 --layout fsdp``
always meant). A dimension that cannot be split as asked stays replicated and is reported, with
its byte cost, as a :class:`ShardingIssue`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

from jaxmem.errors import UserError, did_you_mean
from jaxmem.program.options import LAYOUTS

DEFAULT_LAYOUT = "fsdp"   # --layout's default (options.AnalyzeOptions)

# role -> the axis names that take it, the canonical one first
ROLES: dict[str, tuple[str, ...]] = {
    "data": ("data", "dp", "batch"),
    "fsdp": ("fsdp",),
    "tensor": ("tensor", "model", "tp"),
    "context": ("context", "sequence", "sp", "seq"),
    "expert": ("expert", "ep"),
    "stage": ("stage", "pp"),
}
ROLE_OF = {name: role for role, names in ROLES.items() for name in names}
ROLE_HELP = {
    "data": "replicas: batch split, state replicated",
    "fsdp": "batch split, state sharded (ZeRO-3)",
    "tensor": "Megatron column/row split of the weights",
    "context": "the sequence dimension of the batch and activations split",
    "expert": "MoE experts split, batch split as for data",
    "stage": "pipeline stages: the scanned layers split into stages (--pipeline, --microbatches)",
}
BATCH_ROLES = ("data", "fsdp", "expert")
MODEL_AXIS_NAMES = ROLES["tensor"]


def roles_text() -> str:
    """Every role, its aliases and what it does: the list an unknown axis name's error gives."""
    return "; ".join(f"{names[0]}" + (f" (alias {', '.join(names[1:])})" if names[1:] else "") + f": {ROLE_HELP[r]}"
                     for r, names in ROLES.items())


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    axes: tuple[tuple[str, int], ...]
    given_roles: tuple[tuple[str, str], ...] = ()   # --axis-roles: (axis, role) for the names it maps

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def role(self, name: str) -> str | None:
        """The role of the axis `name`: given by --axis-roles, else its name's (ROLES)."""
        return dict(self.given_roles).get(name) or ROLE_OF.get(name)

    @property
    def roles(self) -> tuple[tuple[str, str], ...]:
        """(axis, role) in mesh order."""
        return tuple((n, self.role(n) or "?") for n in self.names)

    def with_role(self, *roles: str) -> tuple[str, ...]:
        """The axes that have one of `roles`, in mesh order."""
        return tuple(n for n in self.names if self.role(n) in roles)

    def resolve_name(self, name: str) -> str | None:
        """The mesh axis a name in a rule or annotation means: the axis of that name, else the mesh's
        axis of the role the name has (`model` on a mesh whose tensor axis is `tp`); None if absent."""
        if name in self.names:
            return name
        return self.axis_of(ROLE_OF[name]) if name in ROLE_OF else None

    def axis_of(self, role: str) -> str | None:
        found = self.with_role(role)
        return found[0] if found else None

    @property
    def model_axis(self) -> str | None:
        """The tensor-parallel axis (named tensor, model or tp)."""
        return self.axis_of("tensor")

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """A model's own axis names (EasyDeL's ``dp, fsdp, ep, tp, sp``, tunix's ``fsdp, tp``) are the mesh's
names: the common ones above have their role without being asked; any other takes one from
``--axis-roles NAME=ROLE[,NAME=ROLE]`` (API ``axis_roles=``), so the model's parameter annotations
and rules that name those axes apply as written.

The axes that split the batch: data, fsdp and expert, in mesh order."""
        return self.with_role(*BATCH_ROLES)

    @property
    def data_axes(self) -> tuple[str, ...]:
        """The data-parallel axes: those that split the batch (`batch_axes`)."""
        return self.batch_axes

    @property
    def state_axes(self) -> tuple[str, ...]:
        """The axes the fsdp layouts shard the state over: the fsdp axes, else the data axes."""
        return self.with_role("fsdp") or self.with_role("data")

    @property
    def context_axis(self) -> str | None:
        return self.axis_of("context")

    def axis_size(self, axes: str | tuple[str, ...] | None) -> int:
        if axes is None:
            return 1
        if isinstance(axes, str):
            axes = (axes,)
        d = dict(self.axes)
        return math.prod(d.get(a, 1) for a in axes)

    @property
    def data_size(self) -> int:
        return self.axis_size(self.data_axes)

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in self.axes)


def mesh_size(text: str) -> int:
    """The devices a --mesh asks for, its names unchecked (their roles may come with --axis-roles):
    what the CLI needs before jax starts."""
    sizes = re.findall(r"=\s*(\d{1,18})\s*(?:,|$)", text)
    return math.prod(int(n) for n in sizes) if sizes else 1


def parse_axis_roles(text: str | None, names: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """`--axis-roles dp=data,tp=tensor` -> ((axis, role), ...), each axis one of the mesh's `names`."""
    out: list[tuple[str, str]] = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([A-Za-z_]+)", part)
        if not m:
            raise UserError(f"--axis-roles {text!r}: expected AXIS=ROLE[,AXIS=ROLE], e.g. dp=data,tp=tensor")
        name, role = m.group(1), m.group(2)
        role = ROLE_OF.get(role, role)   # a role by one of its names: tp=model is tp=tensor
        if role not in ROLES:
            raise UserError(f"--axis-roles {text!r}: {role!r} is no role; the roles: {roles_text()}")
        if name not in names:
            raise UserError(f"--axis-roles {text!r}: the mesh has no axis {name!r} (its axes: {', '.join(names)}); "
                            "name an axis of --mesh")
        if name in dict(out):
            raise UserError(f"--axis-roles {text!r}: axis {name} given twice")
        out.append((name, role))
    return tuple(out)


def parse_mesh(text: str, roles: str | None = None, *, need_roles: bool = True) -> MeshSpec:
    """`data=4,model=2` -> MeshSpec; order is the device-grid order. Every axis has a role, from
    `roles` (--axis-roles `dp=data,tp=tensor`) or its name (ROLES), each role at most one axis.
    `need_roles=False`: the syntax only (the CLI's check of --mesh alone, before --axis-roles)."""
    axes: list[tuple[str, int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)", part)
        if not m:
            raise UserError(f"--mesh {text!r}: expected AXIS=N[,AXIS=N], e.g. data=8 or data=4,model=2")
        if len(m.group(2).lstrip("0")) > 18:   # int() refuses past 4300 digits; no mesh has 10**18 devices
            raise UserError(f"--mesh {text[:80]!r}{'...' if len(text) > 80 else ''}: axis {m.group(1)} has "
                            f"{len(m.group(2))} digits of devices; give a device count, e.g. {m.group(1)}=8")
        name, size = m.group(1), int(m.group(2))
        if size < 1:
            raise UserError(f"--mesh {text!r}: axis {name} must have at least 1 device")
        if name in (a for a, _ in axes):
            raise UserError(f"--mesh {text!r}: axis {name} given twice")
        axes.append((name, size))
    if not axes:
        raise UserError("--mesh is empty; e.g. --mesh data=8")
    spec = MeshSpec(tuple(axes), parse_axis_roles(roles, [a for a, _ in axes]))
    if not need_roles:
        return spec
    seen: dict[str, str] = {}
    for name, _ in axes:
        role = spec.role(name)
        if role is None:
            raise UserError(f"--mesh {text!r}: axis {name!r} has no role{did_you_mean(name, ROLE_OF)}. Give it one "
                            f"with --axis-roles {name}=ROLE (API axis_roles=), or name the axis for its role: "
                            f"{roles_text()}")
        if role in seen:
            raise UserError(f"--mesh {text!r}: axes {seen[role]} and {name} both have the {role} role; "
                            f"give one {role} axis")
        seen[role] = name
    return spec


def build_mesh(devices, mesh: MeshSpec, axis_types: str = "auto"):
    """The jax Mesh for `mesh` over the first devices, in order: one rule for the
    compile-only devices analyze predicts on and the local ones verify measures on. Its axes are
    all Auto or all Explicit (--axis-types), as jax.make_mesh's are."""
    # numpy and jax here: this module is jax-free at import (meshes are parsed before jax starts, jaxmem.session)
    import numpy as np  # noqa: PLC0415
    from jax.sharding import AxisType, Mesh  # noqa: PLC0415

    if len(devices) < mesh.size:
        raise UserError(f"the mesh {mesh} needs {mesh.size} devices; there are {len(devices)}")
    kind = AxisType.Explicit if axis_types == "explicit" else AxisType.Auto
    return Mesh(np.array(list(devices)[: mesh.size], dtype=object).reshape(mesh.shape), mesh.names,
                axis_types=(kind,) * len(mesh.names))


@dataclasses.dataclass(frozen=True)
class ShardingIssue:
    """A leaf dimension that could not be sharded as the layout asked."""

    leaf: str
    shape: tuple[int, ...]
    axis: str
    reason: str
    replicated_bytes: int   # extra bytes per device from keeping it replicated
    # "replicated": the dimension stays whole; "poor_dimension": the fallback split a smaller dimension
    # (split_dim) because the largest does not divide (an embedding split on its hidden size): padded_to fixes it
    kind: str = "replicated"
    split_dim: int | None = None
    padded_to: int | None = None


def check_layout(layout: str, mesh: MeshSpec, *, custom_step: bool = False, own_specs: bool = False) -> None:
    """The layout against the mesh's roles, and the roles jaxmem's own step cannot play.
    `own_specs`: the workload shards its state itself (Workload.state_specs): no layout applies."""
    if layout not in LAYOUTS:
        raise UserError(f"unknown layout {layout!r}. Known: {', '.join(LAYOUTS)}.")
    if own_specs:
        if layout != DEFAULT_LAYOUT:   # as --precision/--accum are refused for a step jaxmem does not build
            raise UserError(f"--layout {layout}: this workload shards its state itself (Workload(state_specs=...)), "
                            "so no layout applies; drop --layout (the report's layout is `user`)")
        return
    if layout in ("tp", "fsdp_tp") and mesh.model_axis is None:
        raise UserError(f"--layout {layout} needs a model axis in --mesh (e.g. --mesh data=4,model=2); got {mesh}")
    if layout in ("fsdp", "fsdp_tp") and not mesh.state_axes and not mesh.axis_of("stage"):
        raise UserError(f"--layout {layout} needs an fsdp or a data axis in --mesh to shard the state over "
                        f"(e.g. --mesh data=8 or --mesh fsdp=8); got {mesh}")
    fsdp = mesh.with_role("fsdp")
    if fsdp and layout in ("dp", "tp") and not custom_step:
        better = "fsdp" if layout == "dp" else "fsdp_tp"
        raise UserError(f"--layout {layout} keeps the state unsharded, but the mesh's {fsdp[0]} axis exists to shard "
                        f"it; use --layout {better}, or name the axis data (replicas) in --mesh")


def spec_axes(axes: tuple[str, ...]):
    """A PartitionSpec entry: one axis name or a tuple of several."""
    return axes[0] if len(axes) == 1 else axes


def used_axes(spec) -> tuple[str, ...]:
    out: list[str] = []
    for s in spec:
        if s is None:
            continue
        out.extend([s] if isinstance(s, str) else s)
    return tuple(out)


def batch_spec(shape: tuple[int, ...], mesh: MeshSpec, path: str):
    """Batch leaves: dim 0 split over the batch axes (data, fsdp, expert); dim 1 (the sequence) of
    leaves of rank 2 or more over the context axis."""
    data = mesh.batch_axes
    size = mesh.axis_size(data)
    if not shape:
        return ()
    if size > 1 and shape[0] % size:
        raise UserError(
            f"batch leaf {path!r}: global batch {shape[0]} is not divisible by the {size} devices of the data "
            f"axes ({'x'.join(data)}); use a --batch that is a multiple of {size}"
        )
    spec: list[Any] = [spec_axes(data) if data and size > 1 else None] + [None] * (len(shape) - 1)
    ctx = mesh.context_axis
    if ctx and mesh.axis_size(ctx) > 1 and len(shape) >= 2:
        c = mesh.axis_size(ctx)
        if shape[1] % c:
            raise UserError(
                f"batch leaf {path!r} {tuple(shape)}: its sequence dimension (dim 1) {shape[1]} is not divisible by "
                f"{ctx}={c} (the context axis splits dim 1 of every batch leaf of rank 2 or more); use a sequence "
                f"length that is a multiple of {c}, or a smaller {ctx} axis")
        spec[1] = ctx
    return tuple(spec)


def seq_len(shapes: Sequence[tuple[int, ...]]) -> int | None:
    """The sequence length the context axis splits: dim 1 of the first batch leaf of rank 2 or more."""
    return next((s[1] for s in shapes if len(s) >= 2), None)
