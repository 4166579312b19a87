"""All-gathered parameters at the peak, and the gathered_params_live audit.

Under FSDP each layer's weights are all-gathered before it runs and freed after; one layer's gathered
weights live at a time is FSDP working. Weights of several layers gathered at once -- kept for the
backward pass, or gathered ahead of use -- are memory a scan of the layers frees (a checkpoint alone, on
some jax versions only: ``_fix``). Only a
collective of a parameter's own data counts (its argument found through the program's graph:
jaxmem.xla.provenance.Graph.argument): a gathered activation, the batch, a reduced gradient never does.

A parameter's layer is read from its path (``layer_of``): a scanned layer's stacked weights are one layer,
gathered one iteration's slice at a time inside the loop.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from jaxmem.report import ReportWarning
from jaxmem.units import fmt_bytes
from jaxmem.xla.buffers import Buffer

SHARE = 0.10   # of the peak: the weights gathered beyond one layer's that are worth a warning

# How a model of each kind runs its layers as one layer's program, checkpointed (a config.json decoder: jaxmem's)
_SCAN = {"linen": "nn.scan with the layer checkpointed inside it (nn.remat)",
         "nnx": "nnx.scan over layers made by nnx.vmap, with the layer checkpointed inside it (nnx.remat)",
         "step": "jax.lax.scan over the layers' stacked weights, with its body checkpointed (jax.checkpoint)",
         "decoder": "--arg scan=true, jaxmem's default, with --remat full"}
_SCANNED = {"linen": "nn.scan", "nnx": "nnx.scan", "step": "a scan", "decoder": "a scan"}


@dataclasses.dataclass(frozen=True)
class GatheredParam:
    """A buffer that holds a parameter all-gathered (moved, cast, sliced out of a scan's stack)."""

    size: int
    shape: tuple[int, ...]
    leaf: str          # the parameter's state leaf ('params:layers/1/linear/kernel')
    scanned: bool      # one iteration's slice of a stack a loop carries: a scanned layer's, gathered in the loop


def gathered_param(b: Buffer, leaf_categories: Sequence[str], leaf_paths: Sequence[str]) -> GatheredParam | None:
    """A collective's buffer as a gathered parameter, None where its data is not a parameter's own (frozen
    parameters are "params" too)."""
    src = b.source_argument
    if not b.collective or not 0 <= src < len(leaf_categories) or leaf_categories[src] != "params":
        return None
    leaf = leaf_paths[src] if src < len(leaf_paths) else f"argument {src}"
    return GatheredParam(b.size, tuple(b.shape), leaf, b.source_scanned)


def layer_of(leaf: str) -> str:
    """The layer a parameter belongs to, as its path names it: the path up to its first part with a digit
    ('params:blocks/2/mlp/up/kernel' -> 'blocks/2', 'layer_0/dense/kernel' -> 'layer_0'), else its first part
    (a scan's stacked 'layers/up/kernel' -> 'layers', 'embed/embedding' -> 'embed')."""
    parts = [p for p in leaf.split(":", 1)[-1].split("/") if p]
    for i, part in enumerate(parts[:-1]):
        if any(c.isdigit() for c in part):
            return "/".join(parts[:i + 1])
    return parts[0] if parts else leaf


def check_gathered_params(gathered: Sequence[GatheredParam], peak: int, *, model: str,
                          scanned: bool) -> list[ReportWarning]:
    """gathered_params_live: gathered parameters of several layers live at the peak, those beyond the one
    layer FSDP needs -- the scanned layer's where the peak is inside a scan, else the largest layer's -- over
    SHARE of it (their bytes: what one layer at a time would save). The advice fits the model: `model`
    "linen", "nnx", "step" (a custom step's own JAX code) or "decoder" (a config.json decoder jaxmem builds);
    `scanned`: the program gathers a scanned layer's weights (its layers are a scan)."""
    by_layer: dict[str, int] = defaultdict(int)
    in_scan = sum(g.size for g in gathered if g.scanned)
    for g in gathered:
        if not g.scanned:
            by_layer[layer_of(g.leaf)] += g.size
    total = in_scan + sum(by_layer.values())
    beyond = total - (in_scan or max(by_layer.values(), default=0))
    if len(by_layer) + bool(in_scan) < 2 or beyond <= SHARE * peak:
        return []
    ranked = sorted(by_layer.items(), key=lambda kv: -kv[1])
    named = ", ".join(f"{layer} {fmt_bytes(n)}" for layer, n in ranked[:4]) + (", ..." if len(ranked) > 4 else "")
    if in_scan:
        facts = (f"all-gathered weights are live at the peak inside the layers' scan: the scanned layer's "
                 f"{fmt_bytes(in_scan)} and, gathered outside the scan, {fmt_bytes(beyond)} ({named})")
    else:
        facts = (f"all-gathered weights of {len(by_layer)} layers are live at the peak, {fmt_bytes(total)} ({named}): "
                 f"{fmt_bytes(beyond)} more than one layer's, which is all FSDP needs at a time")
    return [ReportWarning("gathered_params_live", f"{facts}; {_fix(model, scanned or bool(in_scan))}", beyond)]


def _fix(model: str, scanned: bool) -> str:
    """gathered_params_live's advice, in the model's own terms: a scan is never advised where there is one,
    nor nn.scan to an NNX model or a plain-JAX step. A scan with the layer checkpointed inside it is what frees
    a loop's gathered weights on every jax in the range; a checkpoint alone frees them on some only
    (tests/fixtures/gathered_layers.py at batch 64 with --remat full --remat-at Layer: 8 MiB still gathered at
    the peak on jax 0.10.2, peak 14.13 MB, none on 0.9.0, 12.98 MB; under the scan one layer's 1 MiB, 12.09 and
    9.87 MB), so it is not advised alone."""
    if scanned:
        return (f"the layers already run under {_SCANNED[model]}, one layer's weights gathered per iteration; "
                "neither a scan nor a checkpoint of the layers frees the weights of modules outside it, gathered "
                "whole: their sharding decides what is gathered (--rules)")
    return ("in a Python loop of layers XLA gathers each layer's weights once for the forward and backward pass, or "
            "combines the gathers ahead of use, so every layer's are live at once; run the layers under "
            f"{_SCAN[model]}: its loop gathers one layer's weights per iteration, in the forward pass and again in the "
            "backward one")
