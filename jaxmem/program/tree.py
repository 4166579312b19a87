"""Pytree helpers every part of the program uses: a leaf's path as the report prints it, and
whether a dtype is floating. A leaf: it imports nothing of jaxmem."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def path_str(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def x64() -> bool:
    """Whether jax runs with 64-bit types (jax_enable_x64): it widens what XLA can index."""
    return bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]  # jax sets its flags at run time
