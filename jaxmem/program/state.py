"""The abstract train state: which leaves exist, which are trained, where they live.

Everything here is shapes and dtypes (``jax.ShapeDtypeStruct``), never arrays. The
state is the step's arguments before sharding: the parameters split into a
*trainable* and a *frozen* tree (the same structure, ``None`` where the other tree
holds the leaf, so both flatten to the paths the full tree has), the optimizer
state (built over the trainable tree only), the mutable collections, the RNG and
the batch. Shardings are ``sharding.py``'s; the step function is ``step.py``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from jaxmem import errors
from jaxmem.errors import UserError, located
from jaxmem.program import calls, finetune, fp8
from jaxmem.program.options import FineTune, StepOptions
from jaxmem.program.tree import is_float
from jaxmem.program.workload import Workload

OPTIMIZERS: dict[str, Callable[[], Any]] = {
    "sgd": lambda: optax.sgd(1e-2),
    "momentum": lambda: optax.sgd(1e-2, momentum=0.9),
    "adam": lambda: optax.adam(1e-3),
    "adamw": lambda: optax.adamw(1e-3),
    "adafactor": lambda: optax.adafactor(1e-3),
    "lion": lambda: optax.lion(1e-4),
}


@dataclasses.dataclass
class AbstractState:
    """The step's inputs, abstractly, and what the step needs to rebuild the model from them."""

    kind: str                   # "linen" | "nnx"
    model: Any                  # the linen module, or the NNX graphdef
    trainable: Any              # params pytree; None where a leaf is frozen
    frozen: Any                 # params pytree; None where a leaf is trainable ({} when nothing is frozen)
    param_names: Any            # logical axis names, the full params tree
    opt_state: Any              # tx.init(trainable)
    mutable: Any                # linen collections / NNX non-Param state
    rng: Any
    batch: Any
    tx: optax.GradientTransformation
    micro_size: int | None      # leading dim of one microbatch
    opt_memory: str = "device"  # where the optimizer state lives between steps: "device" | "pinned_host"
    trainable_source: str = finetune.EVERY   # what chose the trainable leaves (finetune.trainable_set)
    lora_skipped: dict = dataclasses.field(default_factory=dict)   # --lora: modules left without an adapter, why

    def params(self, trainable, frozen):
        """The full params tree from its two parts (inside the step: traced values)."""
        if not jax.tree.leaves(frozen):
            return trainable
        return jax.tree.map(lambda t, f: t if f is None else f, trainable, frozen, is_leaf=lambda x: x is None)


def abstract_state(wl: Workload, opts: StepOptions, batch, call_context: Callable[[], Any] | None = None,
                   build_context: Callable[[], Any] | None = None) -> AbstractState:
    """The step's inputs abstractly. `call_context`: the context an NNX model's first call (its init
    trace, :func:`first_called`) runs in: the mesh in context, as the step's trace. `build_context`:
    the one its construction runs in (the target's devices as jax.devices(): EasyDeL builds its own
    mesh from them)."""
    ft = opts.finetune
    finetune.check(ft, precision=opts.precision, donate=opts.donate)
    tx = optimizer(wl, opts)
    split = opts.accum * (opts.microbatches or 1)   # --accum's microbatches, each split again by the pipeline's
    lora_skipped: dict[str, str] = {}   # filled as the linen model is traced (finetune.wrap_linen)
    if is_nnx(wl):
        kind = "nnx"
        model, params, mutable, param_names, own = _abstract_nnx(wl, ft, micro(batch, split), opts.precision,
                                                                 call_context, build_context)
    else:
        own = None
        if not isinstance(wl.model, nn.Module):
            raise UserError(f"Workload.model is a {type(wl.model).__name__}; expected a Flax linen or NNX module")
        kind, model = "linen", (finetune.wrap_linen(wl.model, ft, lora_skipped) if ft.lora_rank else wl.model)
        if opts.precision == "fp8":
            model = fp8.wrap_linen(model, wl.fp8_exclude)
        with fp8.scans_carry_state() if opts.precision == "fp8" else contextlib.nullcontext():
            params, mutable, param_names = _abstract_linen(wl, model, micro(batch, split))
    if opts.precision == "bf16-pure":
        params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16) if is_float(x.dtype) else x, params)
    trainable, frozen, source = finetune.trainable_set(params, ft, own)
    if ft.lora_rank:
        frozen = finetune.store_base(frozen, ft, opts.precision)
    opt_state = jax.eval_shape(tx.init, trainable)   # over the trainable tree only
    rng = {"rng": jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))}
    leaves = jax.tree.leaves(batch)
    micro_size = leaves[0].shape[0] // split if leaves and leaves[0].shape else None
    return AbstractState(kind, model, trainable, frozen, param_names, opt_state, mutable, rng, batch, tx, micro_size,
                         "pinned_host" if ft.offload_optimizer else "device", source, lora_skipped)


def override_batch(batch, batch_size: int | None):
    """The batch abstractly, with `batch_size` (--batch) as the leading dimension of every leaf that
    has one. A --batch that no leaf can take is refused: ignored, it would analyze another step
    than the one asked for."""
    def one(x):
        x = x if isinstance(x, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(np.shape(x), x.dtype)
        if batch_size is not None and x.shape:
            x = jax.ShapeDtypeStruct((batch_size,) + tuple(x.shape[1:]), x.dtype)
        return x

    out = jax.tree.map(one, batch)
    flat = jax.tree_util.tree_flatten_with_path(out)[0]
    if batch_size is not None and not any(x.shape for _, x in flat):
        shown = [f"batch{jax.tree_util.keystr(p)}: {x.dtype}[{','.join(map(str, x.shape))}]" for p, x in flat[:8]]
        more = f" and {len(flat) - 8} more" if len(flat) > 8 else ""
        raise UserError(f"--batch {batch_size}: the workload's batch has no leaf with a batch dimension to set "
                        f"({', '.join(shown)}{more}: scalars only); --batch sets the leading dimension of the batch's "
                        "arrays. Drop --batch, or give the batch leaves their leading batch dimension in workload() "
                        "(e.g. jax.ShapeDtypeStruct((8, 128), jnp.int32)).")
    return out


def micro(batch, accum: int):
    """One microbatch of `batch`, abstractly."""
    if accum == 1:
        return batch
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // accum,) + tuple(x.shape[1:]), x.dtype), batch)


# The built-in optimizers with their moments stored in bf16 (--moment-dtype bf16): optax's own option where it
# has one (mu_dtype, accumulator_dtype, dtype_momentum); the rest of the state (Adam's nu, Adafactor's factored
# second moments) is cast by moments_in, as optax has no nu_dtype. Plain SGD keeps no moments.
_BF16_MOMENTS: dict[str, Callable[[], Any]] = {
    "momentum": lambda: optax.sgd(1e-2, momentum=0.9, accumulator_dtype=jnp.bfloat16),
    "adam": lambda: optax.adam(1e-3, mu_dtype=jnp.bfloat16),
    "adamw": lambda: optax.adamw(1e-3, mu_dtype=jnp.bfloat16),
    "adafactor": lambda: optax.adafactor(1e-3, dtype_momentum=jnp.bfloat16),
    "lion": lambda: optax.lion(1e-4, mu_dtype=jnp.bfloat16),
}


def optimizer(wl: Workload, opts: StepOptions):
    check_moments(wl, opts)
    if opts.optimizer is None and wl.optimizer is not None:
        return wl.optimizer
    name = (opts.optimizer or "adamw").lower()
    if name not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {opts.optimizer!r}. Known: {', '.join(OPTIMIZERS)}.")
    if opts.moment_dtype == "bf16":
        return moments_in(_BF16_MOMENTS[name](), jnp.bfloat16)
    return OPTIMIZERS[name]()


def check_moments(wl: Workload, opts: StepOptions) -> None:
    """--moment-dtype applies to the optimizers jaxmem builds: refused, naming why, for a workload's own
    optimizer or step (its state is as its code builds it) and for plain SGD (no moments to store)."""
    if opts.moment_dtype is None:
        return
    flag = f"--moment-dtype {opts.moment_dtype}"
    if wl.is_custom_step:
        raise UserError(f"{flag}: this workload gives its own `step`, whose optimizer state is as its code builds "
                        "it; store the moments there (e.g. optax.adamw(lr, mu_dtype=jnp.bfloat16)), or drop "
                        f"{flag}.")
    if opts.optimizer is None and wl.optimizer is not None:
        raise UserError(f"{flag}: the workload gives its own optimizer (Workload.optimizer), whose state jaxmem does "
                        "not change; add --optimizer adamw (or another of jaxmem's) to analyze jaxmem's with bf16 "
                        "moments, or build yours with them (e.g. optax.adamw(lr, mu_dtype=jnp.bfloat16)).")
    if (opts.optimizer or "").lower() == "sgd":
        raise UserError(f"{flag}: --optimizer sgd keeps no moments; drop {flag}, or use --optimizer momentum.")


def moments_in(tx: optax.GradientTransformation, dtype) -> optax.GradientTransformationExtraArgs:
    """`tx` with every floating-point leaf of its state stored in `dtype`: cast at init and after each
    update (the update itself computes in the gradients' precision, as optax's mu_dtype does)."""
    inner = optax.with_extra_args_support(tx)

    def cast(tree):
        return jax.tree.map(lambda x: x.astype(dtype) if is_float(x.dtype) else x, tree)

    def update(updates, state, params=None, **extra):
        out, new = inner.update(updates, state, params, **extra)
        return out, cast(new)

    return optax.GradientTransformationExtraArgs(lambda params: cast(inner.init(params)), update)


def is_nnx(wl: Workload) -> bool:
    if isinstance(wl.model, nn.Module):
        return False   # decided without importing flax.nnx (0.2 s a linen analysis need not pay)
    try:
        from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models
    except ImportError:  # pragma: no cover
        return False
    return isinstance(wl.model, nnx.Module) or callable(wl.model)


def _abstract_linen(wl: Workload, model, batch):
    # abstract keys: no array is made (under an explicit mesh of compile-only devices none could be)
    rngs = jax.eval_shape(lambda: {c: jax.random.key(0) for c in ("params", *wl.rng_collections)})
    loss = wl.loss
    assert loss is not None   # a workload without its own step has a loss (Workload.validate)
    try:
        boxed = jax.eval_shape(lambda r, b: model.init(r, b, method=lambda m, bb: loss(m, bb)), rngs, batch)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 -- the user's model can raise anything: quoted whole
        hint = ""
        if fp8.COLLECTION in str(e):
            hint = (f" (--precision fp8 adds the {fp8.COLLECTION!r} collection to every dense/einsum layer, and to "
                    f"the variable_axes of every nn.scan made when the model is called; a scan made once at import "
                    f"keeps its own: list it there, as MaxText's decoder does: "
                    f"variable_axes={{'params': 0, {fp8.COLLECTION!r}: 0}})")
        raise UserError(f"initializing the model through loss(model, batch) failed: {located(e)}{hint}") from None
    names = nn.get_partition_spec(boxed)
    variables = nn.unbox(boxed)
    params = variables.get("params", {})
    mutable = {k: v for k, v in variables.items() if k not in ("params", "intermediates")}
    param_names = names.get("params", {})
    return params, mutable, param_names


def _abstract_nnx(wl: Workload, ft: FineTune, batch, precision: str = "fp32",
                  call_context: Callable[[], Any] | None = None, build_context: Callable[[], Any] | None = None):
    from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

    model = wl.model
    make = (lambda: model) if isinstance(model, nnx.Module) else (lambda: wl.model(nnx.Rngs(0)))
    if ft.lora_rank:
        try:
            model = finetune.wrap_nnx(make, ft, wl.loss, batch)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 -- the user's model can raise anything: quoted whole
            raise UserError(f"adding qwix LoRA adapters to the NNX model failed: {located(e)}") from None
    elif precision == "fp8":
        try:
            model = fp8.wrap_nnx(make, wl.loss, batch, wl.fp8_exclude)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 -- the user's model can raise anything: quoted whole
            raise UserError(f"putting the NNX model's matmuls in FP8 (qwix) failed: {located(e)}") from None
    else:
        if not isinstance(model, nnx.Module):
            with nnx.use_eager_sharding(False), (build_context or contextlib.nullcontext)():
                try:
                    model = nnx.eval_shape(make)
                except Exception as e:  # noqa: BLE001 -- the user's model can raise anything: quoted whole
                    raise UserError(f"building the NNX model failed: {located(e)}") from None
        model = first_called(model, wl.loss, batch, call_context)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]  # three parts for two filters

    def names_of(v):
        meta = v.get_metadata() if hasattr(v, "get_metadata") else {}
        names = meta.get("out_sharding") or meta.get("sharding_names")   # flax 0.12.3 still says sharding_names
        return P(*names) if names else None

    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    param_names = jax.tree.map(names_of, params, is_leaf=is_var)
    sds = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), t)  # noqa: E731
    # the adapters a user's qwix.apply_lora_to_model put on (jaxmem's own --lora makes the same type)
    own = jax.tree.map(lambda v: jax.tree.map(lambda _: isinstance(v, nnx.LoRAParam), v), params, is_leaf=is_var)
    return graphdef, sds(params), sds(rest), param_names, own


def first_called(model, loss, batch, call_context: Callable[[], Any] | None = None):
    """The NNX `model` with the state it creates on its first call (EasyDeL's models add a cached RoPE
    table then): one abstract call through `loss(model, batch)` (an init trace, no arrays), kept
    only when it added state. Its errors are the step's (the same call fails there)."""
    from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

    graphdef, before_state = nnx.split(model)
    made: dict[str, Any] = {}

    def call(st, b):   # as the step calls it: merged from its state inside the trace
        m = nnx.merge(graphdef, st, copy=True)
        loss(m, b)
        made["graphdef"], after = nnx.split(m)
        return after

    with nnx.use_eager_sharding(False), (call_context or contextlib.nullcontext)():
        try:
            after_state = jax.eval_shape(call, before_state, batch)
        except UserError:
            raise
        except NameError as e:
            if calls.unbound_axis(e) is None:
                raise UserError(errors.trace_error(e, explicit=_explicit_context())) from None
            return model   # a pmap-style collective axis: bound per device group in the step only
        except Exception as e:  # noqa: BLE001 -- the user's model can raise anything: explained as the step's trace
            raise UserError(errors.trace_error(e, explicit=_explicit_context())) from None
    paths = lambda t: {p for p, _ in jax.tree_util.tree_flatten_with_path(t)[0]}  # noqa: E731
    if paths(after_state) == paths(before_state):
        return model
    return nnx.merge(made["graphdef"], after_state)


def _explicit_context() -> bool:
    return any(t == AxisType.Explicit for t in getattr(jax.sharding.get_abstract_mesh(), "axis_types", ()) or ())


def new_state_message(before, after) -> str | None:
    """The leaves the model's call created (present after, not before: a state made on every call),
    as one message naming them; None when the call created none."""
    paths = lambda t: {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(t)[0]}  # noqa: E731
    new = sorted(paths(after) - paths(before))
    if not new:
        return None
    return (f"the model creates state while it is called: {', '.join(new[:5])}"
            f"{f' and {len(new) - 5} more' if len(new) > 5 else ''} appeared during the training step. "
            "Create it in the model's __init__ (or keep it out of the module's state, e.g. a cache computed "
            "in the call without assigning it to an attribute)")
