"""--precision fp8: the model's dense and einsum matmuls in FP8, with delayed scaling.

What the field's FP8 recipes run (MaxText's ``quantization=fp8`` uses Flax's
``nn.Fp8DirectDotGeneralOp``; Transformer Engine's delayed scaling is the same scheme): each
matmul against a weight quantizes its input and its weight to E4M3 and the incoming gradient to
E5M2, each with a scale derived from a 1024-step amax history. The op is Flax's own
``fp8_ops.fp8_scaled_dot_general``; jaxmem puts it under the model's dense/einsum calls through
qwix's interception (as for LoRA), so the model needs no ``dot_general_cls=`` of its own, linen
or NNX. Each such op gets six float32 variables (three scales of 1, three histories of 1024) in
Flax's ``_overwrite_with_gradient`` collection (a model that scans its layers lists it in
``nn.scan``'s ``variable_axes``, as MaxText's decoder does): the breakdown's ``fp8_state``.
Master weights and optimizer state are as under ``bf16`` (fp32), the compute dtype bf16.

The residuals ``fp8_scaled_dot_general`` keeps for the backward pass are the bf16 input and
weight *and* their E4M3 copies: where FP8 training spends more memory than expected, XLA's
buffer assignment shows it. The new amax histories the backward pass computes reach the step as
the cotangents of those variables; jaxmem's step does not write them back (Flax's
``_overwrite_with_gradient``): 12 KiB per op that change no buffer of the step.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
from flax.core import lift
from flax.core.scope import in_filter
from flax.linen import fp8_ops

from jaxmem.program import finetune, patterns

COLLECTION = "_overwrite_with_gradient"   # Flax fp8_ops.OVERWRITE_WITH_GRADIENT: scanned models list it
HISTORY = 1024   # Flax's Fp8DotGeneralBase.amax_history_length (MaxText's and TE's default too)
# fp8_scaled_dot_general's keywords -> the variable names Flax's fp8 modules give them
META = {"lhs_scale": "input_scale", "rhs_scale": "kernel_scale", "grad_scale": "output_grad_scale",
        "lhs_amax_history": "input_amax_history", "rhs_amax_history": "kernel_amax_history",
        "grad_amax_history": "output_grad_amax_history"}


_META_NAME = re.compile(rf"(?:dot_general|einsum)\d+_(?:{'|'.join(META.values())})")


def _provider_class():
    from qwix._src import qconfig  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8
    from qwix._src.utils import flax_util  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8

    class Fp8Provider(qconfig.QuantizationProvider):
        """Every dot_general/einsum whose right operand is a weight of the module, in FP8."""

        def _get_current_rule_and_op_id(self, op_name, **kwargs):   # fp8_exclude decided by RE2

            return patterns.lookup_rule(self, super()._get_current_rule_and_op_id, op_name, **kwargs)

        def _meta(self, op_id: str) -> dict[str, Any]:
            def init(name):
                if name.endswith("history"):
                    return lambda: jnp.zeros((HISTORY,), jnp.float32)
                return lambda: jnp.ones((1,), jnp.float32)

            return {kw: flax_util.get_or_create_variable(COLLECTION, f"{op_id}_{name}", init(name)).value
                    for kw, name in META.items()}

        def dot_general(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *,
                        out_sharding=None):
            rule, op_id = self._get_current_rule_and_op_id("dot_general")
            if rule is None or flax_util.find_param(rhs) is None:   # not a weight: attention's dots stay as written
                return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                           preferred_element_type=preferred_element_type, out_sharding=out_sharding)
            return fp8_ops.fp8_scaled_dot_general(lhs.astype(rhs.dtype), rhs, dimension_numbers,
                                                  preferred_element_type=rhs.dtype, quantize_compute_type=rhs.dtype,
                                                  **self._meta(op_id))

        def einsum(self, eqn, *operands, precision=None, preferred_element_type=None,
                   _dot_general=jax.lax.dot_general, out_sharding=None):
            rule, op_id = self._get_current_rule_and_op_id("einsum")
            if rule is None or len(operands) != 2 or flax_util.find_param(operands[1]) is None:
                return jnp.einsum(eqn, *operands, precision=precision, preferred_element_type=preferred_element_type,
                                  _dot_general=_dot_general, out_sharding=out_sharding)
            lhs, rhs = operands
            meta = self._meta(op_id)

            def dot(a, b, dimension_numbers, precision=None, preferred_element_type=None, **_):
                # einsum may pass the weight first: the per-tensor scales then swap names, not bytes
                return fp8_ops.fp8_scaled_dot_general(a, b, dimension_numbers, preferred_element_type=rhs.dtype,
                                                      quantize_compute_type=rhs.dtype, **meta)

            return jnp.einsum(eqn, lhs.astype(rhs.dtype), rhs, _dot_general=dot)

        def get_intercept_map(self):
            return super().get_intercept_map() | {"jax.lax.dot_general": self.dot_general,
                                                  "jax.numpy.einsum": self.einsum}

    return Fp8Provider


def provider(exclude: str | None = None):
    """Every module's weight matmuls in FP8, but those of modules whose path `exclude` finds."""
    from qwix._src import qconfig  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8

    provider = _provider_class()([qconfig.QuantizationRule(module_path=".*")])
    if exclude is not None:   # each module path decided by RE2 (patterns.lookup_rule), never by qwix's `re`

        rx = patterns.compile_pattern(exclude, "Workload(fp8_exclude=...)")
        provider.jaxmem_paths = {0: lambda path: rx.search(path) is None}
    return provider


def wrap_linen(model, exclude: str | None = None):
    """The linen model with its dense/einsum weights' matmuls in FP8."""
    import qwix  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8

    return qwix.quantize_model(model, provider(exclude))


def wrap_nnx(make_model, loss, batch, exclude: str | None = None):
    """An NNX model with its dense/einsum weights' matmuls in FP8, built abstractly (qwix creates
    the FP8 variables on a first call, with the inputs the loss gives the model)."""
    import qwix  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8
    from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

    nnx.variable_type_from_name(COLLECTION, allow_register=True)   # the Variable type qwix makes its state of

    def build():
        model = make_model()
        args, kwargs = finetune.first_call(model, loss, batch, "--precision fp8")
        return qwix.quantize_model(model, provider(exclude), *args, **kwargs)

    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(build)


def is_meta(path: str) -> bool:
    """A state leaf's path (as the report prints it) is FP8 scaling state: the variables _meta makes,
    named after qwix's op ids (`dot_general0_input_scale`, `einsum1_kernel_amax_history`, ...)."""
    parts = [p for p in path.split("/") if p not in ("value", "raw_value")]
    return bool(parts) and _META_NAME.fullmatch(parts[-1]) is not None


@contextlib.contextmanager
def scans_carry_state():
    """Linen scans made while this is active carry the FP8 scaling collection, one per layer.

    Most scan code lists only ``params`` in ``nn.scan``'s ``variable_axes``; a collection the scan
    does not list is not visible inside it, so the scaling state the injected FP8 ops create would
    have nowhere to live. jaxmem put those ops there, so it also adds ``{COLLECTION: 0}`` to every
    scan that does not already route the collection (as MaxText's decoder lists it itself): each
    layer keeps its own scales and histories, stacked on the scan axis like its weights.
    ``nn.scan`` hands ``flax.core.lift.scan`` to its module class when it is called, which scan code
    does in the enclosing ``__call__``; a scan made once at import keeps the model's own axes.
    """

    orig = lift.scan

    @functools.wraps(orig)
    def scan(fn, variable_axes=None, variable_broadcast=False, variable_carry=False, *args, **kwargs):
        axes = dict(variable_axes or {})
        if not any(in_filter(f, COLLECTION) for f in (*axes, variable_broadcast, variable_carry)):
            axes[COLLECTION] = 0
        return orig(fn, axes, variable_broadcast, variable_carry, *args, **kwargs)

    lift.scan = scan
    try:
        yield
    finally:
        lift.scan = orig
