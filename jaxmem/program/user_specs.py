"""Your own shardings: ``Workload(step=..., state=..., batch=..., state_specs=..., batch_specs=...)``.

The specs are pytrees of ``jax.sharding.PartitionSpec`` (``None`` for a replicated leaf) matching
``state`` and ``batch``, written with the axis names of ``--mesh`` and used verbatim: jaxmem's
layout and rules are not consulted. Everything is checked here, before any device exists; each
error names the leaf's path and the dimension.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from jaxmem.compiler import versions
from jaxmem.errors import UserError
from jaxmem.program.layouts import MeshSpec
from jaxmem.program.tree import path_str


def _is_spec(x) -> bool:
    return x is None or isinstance(x, P)


def resolve(tree, specs, mesh: MeshSpec, what: str) -> list[tuple]:
    """The PartitionSpec entries of every leaf of `tree` (flattened order), from `specs`."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    try:
        flat_specs = jax.tree_util.tree_flatten(specs, is_leaf=_is_spec)[0]
    except (TypeError, ValueError) as e:  # an object that is not a pytree
        raise UserError(f"Workload {what}_specs: not a pytree of PartitionSpecs ({e})") from None
    bad = [s for s in flat_specs if not _is_spec(s)]
    if bad:
        raise UserError(f"Workload {what}_specs: a leaf is a {type(bad[0]).__name__} ({bad[0]!r:.40}); every leaf "
                        "must be a jax.sharding.PartitionSpec (or None: replicated)")
    if _paths(tree) != _paths(specs, _is_spec):
        raise UserError(f"Workload {what}_specs does not match `{what}`: {_difference(tree, specs, what)}")
    out = []
    for (path, x), spec in zip(leaves, flat_specs, strict=True):
        out.append(_check_leaf(f"{what}/{path_str(path)}" if path else what, tuple(x.shape),
                               () if spec is None else tuple(spec), mesh, what))
    return out


def _paths(tree, is_leaf=None) -> list[str]:
    return [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]]


def _difference(tree, specs, what: str) -> str:
    mine, theirs = _paths(tree), _paths(specs, _is_spec)
    missing = [p for p in mine if p not in theirs]
    extra = [p for p in theirs if p not in mine]
    if missing:
        return f"no spec for the leaf {what}/{missing[0]}" + (f" (and {len(missing) - 1} more)" if missing[1:] else "")
    if extra:
        return f"a spec for {what}/{extra[0]}, which `{what}` has no leaf at"
    return f"{len(theirs)} specs for {len(mine)} leaves"


def _check_leaf(path: str, shape: tuple[int, ...], spec: tuple, mesh: MeshSpec, what: str) -> tuple:
    if len(spec) > len(shape):
        raise UserError(f"Workload {what}_specs: {path} {shape} has {len(shape)} dimension(s) but its spec "
                        f"{versions.spec_text(spec)} has {len(spec)} entries")
    sizes = dict(mesh.axes)
    seen: set[str] = set()
    for dim, entry in enumerate(spec):
        if entry is None:
            continue
        axes = (entry,) if isinstance(entry, str) else tuple(entry)
        for a in axes:
            if not isinstance(a, str) or a not in sizes:
                raise UserError(f"Workload {what}_specs: {path} {shape}, dim {dim}: the mesh has no axis {a!r} "
                                f"(--mesh {mesh}: {', '.join(mesh.names)})")
            if a in seen:
                raise UserError(f"Workload {what}_specs: {path} {shape}: its spec {versions.spec_text(spec)} "
                                f"uses the axis {a} twice")
            seen.add(a)
        n = math.prod(sizes[a] for a in axes)
        if shape[dim] % n:
            raise UserError(f"Workload {what}_specs: {path} {shape}, dim {dim} ({shape[dim]}) is not divisible by "
                            f"{'x'.join(axes)}={n}")
    return spec + (None,) * (len(shape) - len(spec))


def check_workload(wl: Any) -> None:
    """Specs belong to a workload that gives its own step."""
    if (wl.state_specs is not None or wl.batch_specs is not None) and not wl.is_custom_step:
        raise UserError("Workload state_specs/batch_specs go with step= (your own training step); for a model, give "
                        "logical axis names and --rules instead")
