"""Pytree helpers every part of the program uses: a leaf's path as the report prints it, whether a
dtype is floating, and where two states differ. A leaf: it imports nothing of jaxmem."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def path_str(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def x64() -> bool:
    """Whether jax runs with 64-bit types (jax_enable_x64): it widens what XLA can index."""
    return bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]  # jax sets its flags at run time


def state_difference(old: Any, new: Any) -> str | None:
    """The first leaf where a custom step's new state differs from its input (structure, shape or dtype),
    in words; None when they match."""
    flat_old, tree_old = jax.tree_util.tree_flatten_with_path(old)
    flat_new, tree_new = jax.tree_util.tree_flatten_with_path(new)
    keys_old = [jax.tree_util.keystr(p) for p, _ in flat_old]
    keys_new = [jax.tree_util.keystr(p) for p, _ in flat_new]
    gone, added = [k for k in keys_old if k not in set(keys_new)], [k for k in keys_new if k not in set(keys_old)]
    if gone or added:
        return f"state{gone[0]} is only in the input" if gone else f"state{added[0]} is only in the new state"
    for i, (ko, kn) in enumerate(zip(keys_old, keys_new, strict=False)):
        if ko != kn:
            return f"leaf {i} is state{ko} in the input and state{kn} in the new state"
    if len(keys_old) != len(keys_new):
        more, where = (keys_old, "input") if len(keys_old) > len(keys_new) else (keys_new, "new state")
        first = more[min(len(keys_old), len(keys_new))]
        return (f"the input has {len(keys_old)} leaves and the new state {len(keys_new)}: state{first} is only in "
                f"the {where}")
    if str(tree_old) != str(tree_new):   # the containers (their types and static fields), as jax prints them
        return f"the containers differ: {_clip(str(tree_old))} in, {_clip(str(tree_new))} out"
    for key, (_, a), (_, b) in zip(keys_old, flat_old, flat_new, strict=True):
        sa, sb = tuple(getattr(a, "shape", ())), tuple(getattr(b, "shape", ()))
        da, db = getattr(a, "dtype", None), getattr(b, "dtype", None)
        if sa != sb or da != db:
            return f"state{key} is {da}{list(sa)} in the input and {db}{list(sb)} in the new state"
    return None


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}..."
