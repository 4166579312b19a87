"""Sizes XLA cannot express, refused before XLA sees them.

Two limits hold for every array of the step (params, optimizer state, batch), checked on
the abstract leaves before lowering (docs/how-it-works.md "Sizes XLA cannot express"):

* its size in bytes must fit in a signed 64-bit integer (XLA's byte counts are int64);
* without ``jax_enable_x64`` (jax's default) every dimension must fit in int32: jax's
  gather/scatter indices are int32 then, and a larger dimension is truncated (jax warns)
  or crashes XLA:GPU (a RET_CHECK on kernel launch dimensions, or a segfault).

Two more are properties of the traced step and its loops, checked before XLA compiles:

* a matmul's batch dimensions: XLA:GPU merges them into one dimension, which must fit in int32
  (:func:`check_dots`; the tiny Llama at --batch 2147483629 has a grouped-query attention matmul of
  2 x 2147483629 batches, and XLA failed with "Invalid dimension size -38");
* a loop's trip count (--accum's microbatches, a pipeline's M R + N - 1 iterations): XLA's compile
  time grows with it (:func:`check_loop`; a pipeline of 1,000,003 microbatches ran past 100 s).

Temporaries can still exceed what one GPU kernel can launch; XLA's RET_CHECK for that, and a
dimension that overflowed int32 inside XLA, are turned into the same kind of message
(:func:`compile_limit_error`).
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


def check_dots(eqns) -> None:
    """Every dot_general among `eqns` (jaxpr equations: sharding's walk of the traced step) whose
    batch dimensions multiply past int32: XLA:GPU runs them as one dimension of the matmul, and a
    larger one wraps around (XLA's "Invalid dimension size -38"). Global shapes, as check_leaves."""
    for eqn in eqns:
        if getattr(getattr(eqn, "primitive", None), "name", None) != "dot_general":
            continue
        (_, _), (lhs_batch, _) = eqn.params["dimension_numbers"]
        lhs, rhs = (tuple(int(d) for d in v.aval.shape) for v in eqn.invars[:2])
        merged = math.prod(lhs[d] for d in lhs_batch)
        if merged > INT32_MAX:
            dims = " x ".join(f"{lhs[d]:,}" for d in lhs_batch)
            raise UserError(f"a matmul of the step, {list(lhs)} by {list(rhs)}, runs {dims} = {merged:,} batches: "
                            f"XLA:GPU runs a matmul's batch dimensions as one, of at most {INT32_MAX:,} (int32), so "
                            f"XLA cannot shape this step; {_fix('batch')}.")


# The longest loop jaxmem compiles. XLA's compile time grows with a loop's trip count: on the tiny Llama (2 loaded
# cores) --accum 100,003 took 22 s (16 s compiling) and 1,000,003 took 52 s; a pipeline of 65,536 microbatches 77 s
# (49 s compiling) and one of 1,000,003 ran past 100 s (a prime batch splits only into one sequence per microbatch).
MAX_LOOP_ITERATIONS = 16384


def check_loop(iterations: int, what: str, fix: str) -> None:
    """Refuse, before anything is traced, a loop of the step longer than MAX_LOOP_ITERATIONS."""
    if iterations > MAX_LOOP_ITERATIONS:
        raise UserError(f"{what} runs {iterations:,} iterations: XLA's compile time grows with a loop's trip count "
                        f"(a million take a minute or more), and jaxmem compiles loops of at most "
                        f"{MAX_LOOP_ITERATIONS:,}; {fix}.")


_LAUNCH = re.compile(r"Kernel '([^']+)' launch needs more blocks \(([^)]*)\) than allowed by hardware \(([^)]*)\)")


_WRAPPED = re.compile(r"Invalid dimension size (-\d+)")


def compile_limit_error(e: BaseException) -> UserError | None:
    """XLA:GPU's RET_CHECK for a kernel too large to launch, and a dimension XLA computed past int32
    (a negative size), as a user error (None: some other error)."""
    wrapped = _WRAPPED.search(str(e))
    if wrapped is not None:
        return UserError(f"XLA cannot shape this step: a dimension it formed from the step's shapes is past "
                         f"{INT32_MAX:,} (int32) and wrapped around to {wrapped.group(1)}; {_fix('batch')}.")
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
