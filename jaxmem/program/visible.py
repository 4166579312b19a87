"""Every sharding visible: what the rules could not do well, and every state leaf's placement.

* ``fallback_poor_dimension``: a parameter the fallback rule (rules.leaf_spec) split on a smaller
  dimension because its largest does not divide (GPT-2's 50257-row embedding under 8 devices, split on
  its hidden size: XLA then computes the global logits), with the padding that lets the rows split;
* ``batch_replicated``: a constraint of the model's own that keeps a batch-sized leading dimension whole
  (a logical name no rule maps, replicated under --unmapped replicate, or a rule that names no batch
  axis): every device holds the whole batch's activation;
* ``state_leaves``: every state leaf's spec and bytes per device (the report's `state_leaves`).
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxmem.program import layouts
from jaxmem.program import rules as rules_mod
from jaxmem.report import ReportWarning


def poor_splits(issues: Sequence[layouts.ShardingIssue], leaves: Sequence) -> list[dict]:
    """The parameters the fallback split on a poor dimension (the report's `choices.fallback_poor`); their
    optimizer-state copies, split as they are, are not listed again."""
    params = {leaf.path.split(":", 1)[-1] for leaf in leaves if leaf.category == "params"}
    return [{"path": i.leaf, "shape": list(i.shape), "axis": i.axis, "split_dim": i.split_dim,
             "padded_to": i.padded_to, "why": i.reason} for i in issues
            if i.kind == "poor_dimension" and i.leaf in params]


def check_poor_splits(issues: Sequence[layouts.ShardingIssue], leaves: Sequence) -> list[ReportWarning]:
    """fallback_poor_dimension: one warning per parameter split on a poor dimension, naming the padding."""
    out = []
    for row in poor_splits(issues, leaves):
        largest = max(range(len(row["shape"])), key=lambda d: row["shape"][d])
        out.append(ReportWarning(
            "fallback_poor_dimension",
            f"{row['path']} {tuple(row['shape'])}: the fallback rule split it over {row['axis']} on dim "
            f"{row['split_dim']} ({row['shape'][row['split_dim']]}) because its largest dim {largest} "
            f"({row['shape'][largest]}) is not divisible; an embedding or output layer split on its hidden size "
            f"makes XLA compute the logits whole. Pad that dimension to {row['padded_to']} (nanoGPT pads 50257 to "
            "50304), or give --rules naming the dims", 0))
    return out


def check_batch_replicated(constraints: dict | None, batch_leaves: Sequence, mesh_spec: layouts.MeshSpec,
                           accum: int, used: dict[str, list[str]]) -> list[ReportWarning]:
    """batch_replicated: each of the model's constraints that keeps a batch-sized leading dimension whole
    on a mesh that splits the batch, with the logical names used there."""
    if not constraints or mesh_spec.data_size < 2:
        return []
    sizes = {leaf.shape[0] for leaf in batch_leaves if leaf.shape}
    sizes |= {n // accum for n in sizes if accum > 1}
    out = []
    for site in constraints.get("leading_whole", ()):
        shape = tuple(site["shape"])
        if not shape or shape[0] not in sizes or shape[0] < mesh_spec.data_size:
            continue
        names = sorted(n for n, places in used.items() if site["at"] in places)
        named = f" (logical names {', '.join(names)})" if names else ""
        out.append(ReportWarning(
            "batch_replicated",
            f"the constraint at {site['at']}{named} keeps the batch dimension (dim 0, {shape[0]} of {shape}) whole: "
            f"{site['spec']}, so every device holds the whole batch's activation there; map its batch name to the "
            f"batch axes ({', '.join(mesh_spec.batch_axes)}) with --rules", 0))
    return out


def state_leaves(leaves: Sequence) -> list[dict]:
    """Every state leaf (parameters, optimizer state, other state, batch): path, category, shape, dtype,
    spec and bytes per device, in the step's argument order (the report's `state_leaves`)."""
    return [{"path": leaf.path, "category": leaf.category, "shape": list(leaf.shape), "dtype": leaf.dtype,
             "spec": [s if s is None or isinstance(s, str) else list(s) for s in leaf.spec],
             "device_bytes": leaf.device_bytes, "memory_kind": leaf.memory_kind} for leaf in leaves]


def sharding_choices(rules, mesh_spec: layouts.MeshSpec, used: dict[str, list[str]], unmapped: str,
                     issues: Sequence[layouts.ShardingIssue], leaves: Sequence) -> tuple[dict, dict]:
    """The report's choices of sharding (logical_rules, fallback_sharding, fallback_poor) and their sources:
    a name's rule is the user's (--rules, --unmapped replicate), the model's, or jaxmem's default (its own rules
    or a convention's, cited); the fallback is jaxmem's."""
    table = rules_mod.logical_rules(used, rules, mesh_spec, unmapped)
    out: dict = {"logical_rules": table, "fallback_sharding": fallback_text(rules),
                 "fallback_poor": poor_splits(issues, leaves)}
    given = {row["source"] for row in table}
    src = {"logical_rules": "user" if "user" in given else "model" if "model" in given else "default",
           "fallback_sharding": "default"}
    return out, src


def fallback_text(rules) -> str:
    """What happens to a parameter dimension no rule names, as rules.rule_set's fallback says."""
    if not rules.fallback:
        return "none: a dimension no rule names stays whole (the layout splits no state by size)"
    parts = [f"{'unannotated parameters of rank 2+' if only else 'any leaf not split yet'}: its largest dimension "
             f"{'x'.join(axes)} divides, over {'+'.join(axes)}" for axes, only in rules.fallback]
    return "; ".join(parts) + " (leaves under 64 KiB that nothing divides stay whole)"
