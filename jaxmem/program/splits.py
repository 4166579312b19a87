"""What each mesh axis splits in a built step, and how the largest leaves are split: the report's
``mesh_roles`` and ``shardings``, and a warning for an axis that does not do its role's job.

An axis does its job when: fsdp, tensor or expert: some state leaf is split over it (an expert
axis on a dense model splits only the batch, like a data axis, and replicates the state);
context: some batch leaf's sequence is split over it. Every other device along an axis that does
not holds and computes what its neighbours do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxmem.program.layouts import MeshSpec
from jaxmem.report import MeshRole, ReportWarning

STATE_ROLES = ("fsdp", "tensor", "expert")


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def mesh_roles(mesh: MeshSpec, leaves: Sequence[Any]) -> dict[str, MeshRole]:
    """axis -> {"role", "size", "splits": what it splits ("batch", "sequence", "state")}."""
    splits: dict[str, set[str]] = {n: set() for n in mesh.names}
    for leaf in leaves:
        for dim, entry in enumerate(leaf.spec):
            for a in _axes(entry):
                if a not in splits:
                    continue
                if leaf.category == "batch":
                    splits[a].add("batch" if dim == 0 else "sequence")
                else:
                    splits[a].add("state")
    order = ("batch", "sequence", "state")
    return {n: {"role": mesh.role(n), "size": s, "splits": [w for w in order if w in splits[n]]} for n, s in mesh.axes}


def shardings(leaves: Sequence[Any], n: int = 20) -> tuple[dict[str, Any], ...]:
    """The `n` largest leaves per device: path, global shape, dtype, spec and per-device bytes."""
    top = sorted(leaves, key=lambda leaf: (-leaf.device_bytes, leaf.path))[:n]
    return tuple({"path": leaf.path, "shape": list(leaf.shape), "dtype": leaf.dtype,
                  "spec": [list(e) if isinstance(e, tuple) else e for e in leaf.spec],
                  "device_bytes": leaf.device_bytes} for leaf in top)


def header(roles: Mapping[str, Mapping[str, Any]]) -> str:
    """`data=2 (data: batch) fsdp=4 (fsdp: batch, state)`: each axis with its role and what it splits."""
    return " ".join(f"{a}={r['size']} ({r['role']}: {', '.join(r['splits']) or 'nothing'})" for a, r in roles.items())


def _tensor_cause(layout: str, logical_names: tuple[str, ...], tensor_names: tuple[str, ...]) -> str:
    """Why a tensor axis splits no weight: the layout, the names the rules know, or the sizes."""
    if layout not in ("tp", "fsdp_tp"):
        return f"--layout {layout} splits none over it: --layout tp or fsdp_tp does)"
    if not logical_names:
        return ("the weights carry no logical axis names, so no rule can place them on it: annotate them "
                "(nn.with_logical_partitioning, nnx metadata sharding=) or give --rules / Workload(state_specs=))")
    if not set(logical_names) & set(tensor_names):
        names = ", ".join(logical_names[:12]) + (", ..." if len(logical_names) > 12 else "")
        return (f"no rule maps the weights' logical names ({names}) to it; the tp rules split "
                f"{', '.join(tensor_names)}: give --rules mapping yours, e.g. [[\"{logical_names[0]}\", \"tensor\"]])")
    return "none has a dimension it divides)"


def idle_axes(roles: Mapping[str, Mapping[str, Any]], layout: str, state_bytes: int, activation_bytes: int,
              logical_names: tuple[str, ...] = (), tensor_names: tuple[str, ...] = ()) -> list[tuple[str, int]]:
    """(message, bytes) for each axis of size > 1 that does not do its role's job; the bytes are its
    cost: what it would save per device if it did (the state, or the activations, over its devices).
    `logical_names`: the names the parameters carry; `tensor_names`: those the rules put on the tensor
    axis (a tensor axis idle because no rule knows the model's names says so)."""
    out = []
    for axis, r in roles.items():
        size, role, did = r["size"], r["role"], r["splits"]
        if size < 2:
            continue
        if role in STATE_ROLES and "state" not in did:
            what = {"expert": "no experts dimension (the model names none exp/expert/experts, or none it divides)",
                    "tensor": "no weight (" + _tensor_cause(layout, logical_names, tensor_names),
                    "fsdp": "no state leaf (none has a dimension it divides)"}[role]
            also = "; it splits the batch, as a data axis would, and" if "batch" in did else ":"
            saved = state_bytes - state_bytes // size
            out.append((f"{axis}={size} ({role}) splits {what}{also} the state is replicated over its {size} devices",
                        saved))
        elif role == "context" and "sequence" not in did:
            saved = activation_bytes - activation_bytes // size
            message = (f"{axis}={size} (context) splits no sequence (no batch leaf of rank 2 or more): its {size} "
                       "devices compute the same activations")
            out.append((message, saved))
    return out


def check_idle_axes(roles: Mapping[str, Mapping[str, Any]], layout: str, state_bytes: int, activation_bytes: int,
                    logical_names: tuple[str, ...], tensor_names: tuple[str, ...]) -> list[ReportWarning]:
    """axis_splits_nothing: each axis of size > 1 that does not do its role's job (idle_axes)."""
    return [ReportWarning("axis_splits_nothing", message, cost)
            for message, cost in idle_axes(roles, layout, state_bytes, activation_bytes, logical_names, tensor_names)]


def check_tensor_by_size(layout: str, mesh_spec: MeshSpec, leaves: Sequence[Any],
                         logical_names: tuple[str, ...]) -> list[ReportWarning]:
    """tensor_split_by_size: a tp layout on weights that carry no logical names: the tensor axis split
    each by its largest dimension, which is not Megatron's split (heads, mlp columns; rows for the
    projections back)."""
    tensor = mesh_spec.model_axis
    if layout not in ("tp", "fsdp_tp") or not tensor or mesh_spec.axis_size(tensor) < 2 or logical_names:
        return []
    split = [leaf for leaf in leaves if leaf.category == "params" and any(tensor in _axes(e) for e in leaf.spec if e)]
    if not split:
        return []
    big = max(split, key=lambda leaf: leaf.global_bytes)
    dim = next(i for i, e in enumerate(big.spec) if e and tensor in _axes(e))
    return [ReportWarning(
        "tensor_split_by_size",
        f"{tensor}={mesh_spec.axis_size(tensor)} split {len(split)} weights that carry no logical axis names by "
        f"their largest dimension (e.g. {big.path.split(':', 1)[-1]} {big.shape} on dim {dim}), which need not be "
        "Megatron's split (attention heads, MLP columns, rows for the projections back): this program's memory and "
        "communication may not be a real tensor-parallel run's. Name the weights' axes "
        "(nn.with_logical_partitioning, nnx.Param sharding metadata), or shard them yourself "
        "(Workload(state_specs=...), --rules)")]
