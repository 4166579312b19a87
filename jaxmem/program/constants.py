"""The constants a step captured: arrays the model's code made from concrete values (numpy, or
`jnp.asarray` of numpy) and closed over, which JAX lowers into the program. Hugging Face's FlaxLlama
builds its rotary table in numpy in `setup`, once per layer (max_position_embeddings rows). XLA may keep
such a table whole in device memory (read at positions the batch gives), or slice it to the rows the
step reads and fold the rest away; the report names each captured constant of at least
:data:`THRESHOLD` bytes, the module whose code read it, and how many of its bytes XLA keeps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxmem.xla.opnames import module_path

THRESHOLD = 1 << 20   # bytes: smaller constants (a mask, a few indices) are not named
_SHOWN_MODULES = 3


@dataclasses.dataclass(frozen=True)
class Captured:
    module: str                 # the Flax module path of the first op that reads it ("" outside any module)
    shape: tuple[int, ...]
    dtype: str
    bytes: int


def captured(closed_jaxpr, threshold: int = THRESHOLD) -> tuple[Captured, ...]:
    """The constants of `closed_jaxpr` (a traced step) and of the jaxprs it calls, of at least
    `threshold` bytes, in program order."""
    out: list[Captured] = []
    seen: set[int] = set()
    _visit(closed_jaxpr.jaxpr, closed_jaxpr.consts, threshold, out, seen)
    return tuple(out)


def _visit(jaxpr, consts, threshold: int, out: list[Captured], seen: set[int]) -> None:
    for var, value in zip(jaxpr.constvars, consts, strict=False):   # a Jaxpr reached alone: none given
        size = int(getattr(value, "nbytes", 0) or 0)
        if size >= threshold and id(value) not in seen:
            seen.add(id(value))
            out.append(Captured(_reader(jaxpr, var), tuple(int(d) for d in np.shape(value)),
                                str(np.dtype(value.dtype)), size))
    for eqn in jaxpr.eqns:
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None and hasattr(sub, "consts"):   # a ClosedJaxpr
                    _visit(inner, sub.consts, threshold, out, seen)
                elif hasattr(sub, "eqns") and hasattr(sub, "constvars"):   # a Jaxpr: its constants are its caller's
                    _visit(sub, (), threshold, out, seen)


def _reader(jaxpr, var) -> str:
    """The module path of the first equation that reads `var` (its name stack, as XLA's op_name)."""
    for eqn in jaxpr.eqns:
        if any(v is var for v in eqn.invars):
            return module_path(f"jit(step)/{eqn.source_info.name_stack}/{eqn.primitive.name}")
    return ""


def rows(found: tuple[Captured, ...], kept: list[int] | None) -> tuple[dict[str, Any], ...]:
    """The report's `constants`: the captured constants grouped by shape and dtype (a table made once
    per layer is one row), each with the modules that read them, how many bytes were captured, and
    how many of them XLA keeps in device memory. `kept`: the sizes of the constants XLA keeps (its
    constant buffers), each matched to at most one captured constant of that many bytes; None when
    unknown (no buffer assignment was read): device_bytes and on_device are then None."""
    left = list(kept or ())
    groups: dict[tuple, dict[str, Any]] = {}
    for c in found:
        g = groups.setdefault((c.shape, c.dtype), {"shape": list(c.shape), "dtype": c.dtype, "count": 0, "bytes": 0,
                                                   "device_bytes": 0, "modules": []})
        g["count"] += 1
        g["bytes"] += c.bytes
        if c.module and c.module not in g["modules"] and len(g["modules"]) < _SHOWN_MODULES:
            g["modules"].append(c.module)
        if c.bytes in left:
            left.remove(c.bytes)
            g["device_bytes"] += c.bytes
    for g in groups.values():
        g["on_device"] = g["device_bytes"] > 0 if kept is not None else None
        if kept is None:
            g["device_bytes"] = None
    return tuple(sorted(groups.values(), key=lambda g: -g["bytes"]))
