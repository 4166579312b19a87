"""Sizes XLA cannot express, refused before XLA sees them.

Two limits hold for every array of the step (params, optimizer state, batch), checked on
the abstract leaves before lowering (docs/how-it-works.md "Sizes XLA cannot express"):

* its size in bytes must fit in a signed 64-bit integer (XLA's byte counts are int64);
* without ``jax_enable_x64`` (jax's default) every dimension must fit in int32: jax's
  gather/scatter indices are int32 then, and a larger dimension is truncated (jax warns)
  or crashes XLA:GPU (a RET_CHECK on kernel launch dimensions, or a segfault).

Temporaries can still exceed what one GPU kernel can launch; XLA's RET_CHECK for that is
turned into the same kind of message (:func:`compile_limit_error`).
"""

from __future__ import annotations

import dataclasses
import math
import re

from jaxmem.errors import UserError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _fix(category: str) -> str:
    if category == "batch":
        return "use a smaller --batch (or the model's batch size)"
    return "check the model's sizes (its --arg values, e.g. hidden or vocab sizes)"


@dataclasses.dataclass(frozen=True)
class Leaf:
    """What check_leaves reads of a leaf (step.LeafInfo has the same fields)."""

    path: str
    category: str
    shape: tuple[int, ...]
    dtype: str
    itemsize: int


def check_leaves(leaves, *, x64: bool) -> None:
    """`leaves`: objects with `.path`, `.category`, `.shape`, `.dtype`, `.itemsize` (step.LeafInfo)."""
    for leaf in leaves:
        shape = tuple(int(d) for d in leaf.shape)
        nbytes = math.prod(shape) * int(leaf.itemsize)
        if nbytes > INT64_MAX:
            raise UserError(f"{leaf.path} {leaf.dtype}{list(shape)} is {nbytes:.3e} bytes, beyond what XLA's 64-bit "
                            "byte "
                            f"counts can express (2^63 - 1); {_fix(leaf.category)}.")
        if not x64 and shape and max(shape) > INT32_MAX:
            raise UserError(f"{leaf.path} {leaf.dtype}{list(shape)} has a dimension of {max(shape):,}, beyond int32 "
                            f"({INT32_MAX:,}): jax indexes arrays with int32 (jax_enable_x64 is off), so XLA cannot "
                            f"compile this step correctly; {_fix(leaf.category)}.")


_LAUNCH = re.compile(r"Kernel '([^']+)' launch needs more blocks \(([^)]*)\) than allowed by hardware \(([^)]*)\)")


def compile_limit_error(e: BaseException) -> UserError | None:
    """XLA:GPU's RET_CHECK for a kernel too large to launch, as a user error (None: some other error)."""
    m = _LAUNCH.search(str(e))
    if m is None:
        return None
    return UserError(f"the step has a temporary too large for one GPU kernel: XLA's kernel {m.group(1)!r} would need "
                     f"({m.group(2)}) thread blocks, more than the hardware's ({m.group(3)}); use a smaller --batch "
                     "(or --accum N to split it into microbatches).")


# Mesh sizes jaxmem can build (docs/how-it-works.md §8): a deviceless topology of 131,072 GPUs
# builds in seconds and one of 1,000,000 crashed XLA; --gpu cpu starts every forced host device
# in this one process (8,192 took 9 s, 1,000,000 crashed).
MAX_DEVICES = 131072
MAX_HOST_DEVICES = 8192


def check_mesh_devices(n: int, *, cpu: bool) -> None:
    """Refuse, before jax starts, a mesh larger than jaxmem can build for its target."""
    limit = MAX_HOST_DEVICES if cpu else MAX_DEVICES
    if n > limit:
        if cpu:
            raise UserError(f"--mesh has {n:,} devices: --gpu cpu starts each as a host device of this one process, "
                            f"at most {limit:,}; use a smaller mesh, or a GPU target (its devices are compile-only).")
        raise UserError(f"--mesh has {n:,} devices: jaxmem builds deviceless meshes of at most {limit:,} devices; "
                        "use a smaller mesh.")
