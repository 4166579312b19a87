"""Which part of a training step each buffer's bytes belong to (params, gradients, activations...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxmem.xla.buffers import Buffer, BufferAssignment

CATEGORIES = (
    "params", "optimizer_state", "batch", "other_state",
    "gradients", "param_copies", "activations", "collectives", "outputs", "temporaries",
)


def is_float(dtype: str) -> bool:
    """An HLO element type ('f32', 'bf16', 'f8e4m3fn'...) is floating point."""
    return dtype.startswith(("f", "bf"))


def categorize(buffer: Buffer, param_categories: Sequence[str], *,
               assignment: BufferAssignment | None = None) -> str:
    """Which part of a training step a buffer's bytes belong to. Heuristics, first match wins:

    - an entry parameter's allocation (a donated parameter's in-place update included):
      ``param_categories[i]``, ``i`` the flat argument index: the parameter number, or, when XLA
      passes all arguments as one tuple parameter, the first element of
      ``parameter_shape_index``. ``"other_state"`` if the caller gave no category for it.
    - ``"outputs"``: live out of the program and not aliased to a parameter.
    - ``"collectives"``: the output of an all-gather / reduce-scatter / all-reduce / all-to-all /
      collective-permute, their ``-start`` / ``-done`` forms and async ops wrapping them.
    - ``"gradients"``: the shape of a floating-point ``"params"`` entry parameter (per device; any
      float dtype: mixed precision accumulates bf16 gradients of fp32 params), not defined in
      the forward pass (``op_name`` without ``jvp(``, or with ``transpose(``: the backward pass
      or an XLA-made zero accumulator), live during the backward pass. Needs ``assignment``.
    - ``"param_copies"``: a forward-pass ``convert_element_type`` with a param's shape: the bf16
      compute copy of an fp32 parameter under mixed precision (kept for the backward pass).
    - ``"activations"``: not defined in the backward pass and still live when it begins
      (``assignment.backward_start``): values saved for the backward pass. Needs
      ``assignment``.
    - ``"constants"``: a constant XLA keeps in device memory (a table the step closed over); only
      where there is one, so not in :data:`CATEGORIES`.
    - ``"temporaries"``: everything else (fusion temporaries, loop-local values, cuBLAS / cuDNN
      workspaces from custom calls).
    """
    if buffer.is_parameter:
        if buffer.dtype == "tuple":          # the pointer table of a tupled parameter
            return "other_state"
        number = buffer.argument_index
        if 0 <= number < len(param_categories):
            return param_categories[number]
        return "other_state"
    if buffer.live_out:
        return "outputs"
    if buffer.is_constant:
        return "constants"
    if buffer.collective:
        return "collectives"
    if (assignment is not None and assignment.backward_start is not None and assignment.backward_end is not None
            and buffer.start >= 0):  # (backward_span sets both or neither)
        forward = "jvp(" in buffer.op_name and not buffer.is_backward
        # by shape alone: under mixed precision the backward pass accumulates bf16 gradients
        # of fp32 parameters
        like = assignment.param_shapes.get(buffer.shape, ()) if is_float(buffer.dtype) else ()
        is_param_shape = buffer.shape and any(0 <= i < len(param_categories) and param_categories[i] == "params"
                                              for i in like)
        if (not forward and is_param_shape
                and buffer.start <= assignment.backward_end and buffer.end >= assignment.backward_start):
            return "gradients"
        if forward and is_param_shape and buffer.op_name.endswith("convert_element_type"):
            return "param_copies"
        if not buffer.is_backward and buffer.start < assignment.backward_start <= buffer.end:
            return "activations"
    return "temporaries"

