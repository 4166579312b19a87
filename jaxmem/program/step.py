"""Builds the jitted training step and its abstract, sharded arguments.

The step is what a competent user runs: forward + loss + backward + optax update,
the train state donated, gradients sharded like the params, and (for layouts with
data axes) every module output whose leading dim is the batch kept batch-sharded,
so that XLA gathers weights layer by layer instead of whole-batch activations
(DESIGN.md §2: 4x less temp on an 8B model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem.program import layouts
from jaxmem.errors import UserError
from jaxmem.program.workload import Workload

PRECISIONS = ("fp32", "bf16", "bf16-pure")
OPTIMIZERS: dict[str, Callable[[], Any]] = {
    "sgd": lambda: optax.sgd(1e-2),
    "momentum": lambda: optax.sgd(1e-2, momentum=0.9),
    "adam": lambda: optax.adam(1e-3),
    "adamw": lambda: optax.adamw(1e-3),
    "adafactor": lambda: optax.adafactor(1e-3),
    "lion": lambda: optax.lion(1e-4),
}

# Entry-parameter categories, in the order the step's arguments flatten.
STATE_PARTS = ("params", "optimizer_state", "other_state")


@dataclasses.dataclass(frozen=True)
class StepOptions:
    layout: str = "fsdp"
    precision: str = "fp32"
    optimizer: str | None = None    # None: the workload's, else AdamW
    batch_size: int | None = None   # global; overrides the leading dim of every batch leaf
    accum: int = 1
    donate: bool = True


@dataclasses.dataclass(frozen=True)
class LeafInfo:
    path: str
    category: str                   # params | optimizer_state | other_state | batch
    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    spec: tuple                     # PartitionSpec entries
    shards: int                     # how many ways the leaf is split

    @property
    def global_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.itemsize

    @property
    def device_bytes(self) -> int:
        return self.global_bytes // self.shards


@dataclasses.dataclass
class BuiltStep:
    """Everything `compiled.py` needs to lower, and `train_state.py` to explain."""

    fn: Callable
    args: tuple                     # ShapeDtypeStructs with NamedShardings
    donate_argnums: tuple[int, ...]
    leaves: list[LeafInfo]          # every entry parameter, in flattened order
    issues: list[layouts.ShardingIssue]
    mesh: Any
    donated: bool
    notes: list[str]
    out_shardings: Any = None
    grad_dtype_of: dict[str, str] = dataclasses.field(default_factory=dict)
    trace_context: Callable[[], Any] = contextlib.nullcontext


def _path_str(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


# ---------------------------------------------------------------- abstract state


def _override_batch(batch, batch_size: int | None):
    def one(x):
        x = x if isinstance(x, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(np.shape(x), x.dtype)
        if batch_size is not None and x.shape:
            x = jax.ShapeDtypeStruct((batch_size,) + tuple(x.shape[1:]), x.dtype)
        return x

    return jax.tree.map(one, batch)


def _abstract_linen(wl: Workload, batch):
    import flax.linen as nn

    rngs = {c: jax.random.key(0) for c in ("params", *wl.rng_collections)}
    try:
        boxed = jax.eval_shape(lambda r, b: wl.model.init(r, b, method=lambda m, bb: wl.loss(m, bb)), rngs, batch)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"initializing the model through loss(model, batch) failed: {type(e).__name__}: {_first_line(e)}") from None
    names = nn.get_partition_spec(boxed)
    variables = nn.unbox(boxed)
    params = variables.get("params", {})
    mutable = {k: v for k, v in variables.items() if k not in ("params", "intermediates")}
    param_names = names.get("params", {})
    return params, mutable, param_names


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else ""


def _nnx_split(wl: Workload):
    from flax import nnx

    model = wl.model
    if not isinstance(model, nnx.Module):
        with nnx.use_eager_sharding(False):
            try:
                model = nnx.eval_shape(lambda: wl.model(nnx.Rngs(0)))
            except Exception as e:
                raise UserError(f"building the NNX model failed: {type(e).__name__}: {_first_line(e)}") from None
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def names_of(v):
        meta = v.get_metadata() if hasattr(v, "get_metadata") else {}
        return P(*meta["out_sharding"]) if meta.get("out_sharding") else None

    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    param_names = jax.tree.map(names_of, params, is_leaf=is_var)
    sds = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), t)  # noqa: E731
    return graphdef, sds(params), sds(rest), param_names


def is_nnx(wl: Workload) -> bool:
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover
        return False
    import flax.linen as nn

    if isinstance(wl.model, nn.Module):
        return False
    return isinstance(wl.model, nnx.Module) or callable(wl.model)


# ---------------------------------------------------------------- the step


def _shard_tree(tree, category, spec_fn, mesh, mesh_spec, leaves: list[LeafInfo]):
    """ShapeDtypeStructs with NamedShardings for every leaf; each leaf recorded in `leaves`.

    `category` is a name or a function of the leaf path (the escape hatch sorts its state).
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    out = []
    for path, x in flat:
        ps = _path_str(path)
        spec = spec_fn(ps, x)
        cat = category(ps) if callable(category) else category
        leaves.append(LeafInfo(f"{cat}:{ps}", cat, tuple(x.shape), str(x.dtype), x.dtype.itemsize, spec,
                               mesh_spec.axis_size(_used(spec))))
        out.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P(*spec))))
    return jax.tree_util.tree_unflatten(treedef, out)



def build(wl: Workload, opts: StepOptions, mesh, mesh_spec: layouts.MeshSpec) -> BuiltStep:
    layouts.check_layout(opts.layout, mesh_spec)
    if opts.precision not in PRECISIONS:
        raise UserError(f"unknown precision {opts.precision!r}. Known: {', '.join(PRECISIONS)}.")
    if opts.accum < 1:
        raise UserError("--accum must be at least 1")
    batch = _override_batch(wl.batch, opts.batch_size)
    if wl.is_custom_step:
        return _build_custom(wl, opts, mesh, mesh_spec, batch)

    tx = _optimizer(wl, opts)
    nnx_model = is_nnx(wl)
    if nnx_model:
        graphdef, params, mutable, param_names = _nnx_split(wl)
    else:
        import flax.linen as nn

        if not isinstance(wl.model, nn.Module):
            raise UserError(f"Workload.model is a {type(wl.model).__name__}; expected a Flax linen or NNX module")
        params, mutable, param_names = _abstract_linen(wl, _micro(batch, opts.accum))
    if opts.precision == "bf16-pure":
        params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16) if _is_float(x.dtype) else x, params)
    opt_state = jax.eval_shape(tx.init, params)

    tp_rules = dict(layouts.DEFAULT_TP_RULES)
    for logical, axis in wl.axis_rules:
        tp_rules[logical] = "model" if axis is not None and axis == mesh_spec.model_axis else None

    issues: list[layouts.ShardingIssue] = []
    leaves: list[LeafInfo] = []

    def names_for(path_keys):
        try:
            node = param_names
            for k in path_keys:
                node = node[getattr(k, "key", getattr(k, "idx", getattr(k, "name", None)))]
            return tuple(node) if node is not None else None
        except (KeyError, IndexError, TypeError):
            return None

    param_specs: dict[str, tuple[tuple, tuple]] = {}   # path -> (shape, spec)
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        ps = _path_str(path)
        spec = layouts.leaf_spec(ps, tuple(x.shape), x.dtype.itemsize, names_for(path), opts.layout, mesh_spec,
                                 tp_rules, issues)
        param_specs[ps] = (tuple(x.shape), spec)

    def opt_spec(ps: str, x) -> tuple:
        # optax states mirror the params tree ('0/mu/<param path>'): the same path suffix and
        # shape -> the param's spec; anything else (counts, factored moments) by the fallback rule.
        parts = ps.split("/")
        for i in range(len(parts)):
            hit = param_specs.get("/".join(parts[i:]))
            if hit is not None and hit[0] == tuple(x.shape):
                return hit[1]
        return layouts.leaf_spec(ps, tuple(x.shape), x.dtype.itemsize, None, opts.layout, mesh_spec, tp_rules, [])

    def shardings(tree, category, spec_fn):
        return _shard_tree(tree, category, spec_fn, mesh, mesh_spec, leaves)

    a_params = shardings(params, "params", lambda ps, x: param_specs[ps][1])
    a_opt = shardings(opt_state, "optimizer_state", opt_spec)
    a_mut = shardings(mutable, "other_state", lambda ps, x: (None,) * len(x.shape))
    a_rng = shardings({"rng": jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))}, "other_state",
                      lambda ps, x: (None,) * len(x.shape))
    a_batch = shardings(batch, "batch", lambda ps, x: layouts.batch_spec(tuple(x.shape), mesh_spec, ps))
    if opts.accum > 1:
        n = jax.tree.leaves(batch)[0].shape[0]
        if n % opts.accum or (n // opts.accum) % max(mesh_spec.data_size, 1):
            raise UserError(f"--accum {opts.accum}: global batch {n} must split into {opts.accum} microbatches "
                            f"each divisible by the {mesh_spec.data_size} data-parallel devices")

    param_sh = jax.tree.map(lambda a: a.sharding, a_params)
    micro_size = jax.tree.leaves(batch)[0].shape[0] // opts.accum if jax.tree.leaves(batch) else None
    act_ctx = functools.partial(_activation_constraints, mesh, mesh_spec, opts.layout, micro_size, wl, nnx_model)

    def cast_compute(tree):
        if opts.precision == "bf16":
            return jax.tree.map(lambda x: x.astype(jnp.bfloat16) if _is_float(x.dtype) else x, tree)
        return tree

    def cast_batch(b):
        if opts.precision in ("bf16", "bf16-pure"):
            return jax.tree.map(lambda x: x.astype(jnp.bfloat16) if _is_float(x.dtype) else x, b)
        return b

    if nnx_model:
        from flax import nnx

        def loss_fn(p, mut, b, key):
            # copy=True: the state was made at the jit trace; grad traces deeper and NNX refuses
            # to mutate (RNG counters, BatchStats) variables across trace levels.
            model = nnx.merge(graphdef, cast_compute(p), mut, copy=True)
            with act_ctx(model):
                loss = wl.loss(model, cast_batch(b))
            _, _, new_mut = nnx.split(model, nnx.Param, ...)
            return jnp.asarray(loss, jnp.float32), new_mut
    else:
        collections = list(mutable)

        def loss_fn(p, mut, b, key):
            bound = wl.model.bind({"params": cast_compute(p), **mut},
                                  rngs={c: jax.random.fold_in(key, i) for i, c in enumerate(wl.rng_collections)},
                                  mutable=collections)
            with act_ctx(None):
                loss = wl.loss(bound, cast_batch(b))
            _, new_vars = bound.unbind()
            new_mut = {c: new_vars[c] for c in collections if c in new_vars}
            return jnp.asarray(loss, jnp.float32), new_mut

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    data_axes = layouts._spec_axes(mesh_spec.data_axes) if mesh_spec.data_axes else None

    def train_step(params, opt_state, mutable, rng_data, batch):
        key = jax.random.wrap_key_data(rng_data["rng"])
        if opts.accum == 1:
            (loss, mutable), grads = grad_fn(params, mutable, batch, key)
        else:
            micro = jax.tree.map(lambda x: x.reshape((opts.accum, x.shape[0] // opts.accum) + x.shape[1:]), batch)
            micro = jax.tree.map(
                lambda x: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, data_axes))), micro)

            def body(carry, mb):
                g_acc, mut, loss_acc, i = carry
                (loss, mut), g = grad_fn(params, mut, mb, jax.random.fold_in(key, i))
                g_acc = jax.tree.map(jnp.add, g_acc, g)
                g_acc = jax.lax.with_sharding_constraint(g_acc, param_sh)
                return (g_acc, mut, loss_acc + loss, i + 1), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            (grads, mutable, loss, _), _ = jax.lax.scan(body, (zeros, mutable, jnp.float32(0), 0), micro)
            grads = jax.tree.map(lambda g: g / opts.accum, grads)
            loss = loss / opts.accum
        # Gradients live where their params live: reduce-scatter under FSDP.
        grads = jax.lax.with_sharding_constraint(grads, param_sh)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, mutable, {"rng": jax.random.key_data(jax.random.fold_in(key, 1))}, loss

    args = (a_params, a_opt, a_mut, a_rng, a_batch)
    donate = (0, 1, 2, 3) if opts.donate else ()
    out_sh = (param_sh, jax.tree.map(lambda a: a.sharding, a_opt), jax.tree.map(lambda a: a.sharding, a_mut),
              jax.tree.map(lambda a: a.sharding, a_rng), NamedSharding(mesh, P()))
    notes = []
    if not opts.donate:
        notes.append("state not donated (--no-donate)")
    rules = _activation_rules(opts.layout, mesh_spec, tp_rules)
    return BuiltStep(train_step, args, donate, leaves, issues, mesh, opts.donate, notes, out_sh,
                     trace_context=functools.partial(_tracing, mesh, rules))


def _activation_rules(layout, mesh_spec, tp_rules) -> tuple:
    """Logical-axis rules for activations the model constrains itself (nn.with_logical_constraint),
    as MaxText does: batch over the data axes; under tp layouts the Megatron names over the model axis."""
    data = mesh_spec.data_axes
    rules = [("batch", layouts._spec_axes(data) if data else None)]
    if layout in ("tp", "fsdp_tp"):
        rules += [(name, mesh_spec.model_axis) for name, role in tp_rules.items() if role == "model"]
    return tuple(rules)


@contextlib.contextmanager
def _tracing(mesh, rules):
    import flax.linen as nn

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield


def _used(spec) -> tuple[str, ...]:
    return layouts._used_axes(spec)


def _micro(batch, accum: int):
    if accum == 1:
        return batch
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // accum,) + tuple(x.shape[1:]), x.dtype), batch)


def _optimizer(wl: Workload, opts: StepOptions):
    if opts.optimizer is None:
        return wl.optimizer if wl.optimizer is not None else optax.adamw(1e-3)
    name = opts.optimizer.lower()
    if name not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {opts.optimizer!r}. Known: {', '.join(OPTIMIZERS)}.")
    return OPTIMIZERS[name]()


@contextlib.contextmanager
def module_outputs(model, fn: Callable[[Any], Any], which: Callable[[type], bool] | None = None):
    """While active, Flax module calls return ``fn(output)``.

    linen (``model`` None): every method but ``setup``, through ``nn.intercept_methods``.
    NNX has no method interceptor, so each module class in ``model``'s graph has its
    ``__call__`` wrapped for the duration (restored on exit). ``which`` narrows it to the
    ``__call__`` of the module classes it accepts.
    """
    if model is None:
        import flax.linen as nn

        def interceptor(next_fun, args, kwargs, context):
            out = next_fun(*args, **kwargs)
            if which is not None:
                hit = context.method_name == "__call__" and which(type(context.module))
            else:
                hit = context.method_name != "setup"
            return fn(out) if hit else out

        with nn.intercept_methods(interceptor):
            yield
        return

    from flax import nnx

    saved = {}
    classes = {type(m) for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Module)}
    for cls in (c for c in classes if which is None or which(c)):
        orig = cls.__dict__.get("__call__")
        if orig is None:
            continue
        saved[cls] = orig

        def wrapped(self, *a, __orig=orig, **k):
            return fn(__orig(self, *a, **k))

        cls.__call__ = wrapped
    try:
        yield
    finally:
        for cls, orig in saved.items():
            cls.__call__ = orig


def _activation_constraints(mesh, mesh_spec, layout, micro_batch, wl, nnx_model, model):
    """Keep module outputs whose leading dim is the batch sharded over the data axes.

    dp/fsdp: the other dims replicated (what FSDP runs); tp layouts: the other dims
    left to XLA (Megatron splits them inside attention/MLP).
    """
    data = mesh_spec.data_axes
    if not data or mesh_spec.data_size == 1 or micro_batch is None:
        return contextlib.nullcontext()
    lead = layouts._spec_axes(data)
    rest = None if layout in ("dp", "fsdp") else P.UNCONSTRAINED

    def one(x):
        if isinstance(x, jax.Array) and x.ndim >= 1 and x.shape[0] == micro_batch:
            return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(lead, *([rest] * (x.ndim - 1)))))
        return x

    return module_outputs(model if nnx_model else None, lambda out: jax.tree.map(one, out))


def _build_custom(wl: Workload, opts: StepOptions, mesh, mesh_spec, batch) -> BuiltStep:
    """The escape hatch: the user's own step(state, batch) and abstract state."""
    if opts.precision != "fp32" or opts.optimizer or opts.accum != 1:
        raise UserError("--precision/--optimizer/--accum apply to steps jaxmem builds; this workload gives its own `step`")
    issues: list[layouts.ShardingIssue] = []
    leaves: list[LeafInfo] = []
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), wl.state)

    def category(ps: str) -> str:
        head = ps.split("/", 1)[0]
        if head in ("params", "param"):
            return "params"
        if head in ("opt_state", "optimizer_state", "opt"):
            return "optimizer_state"
        return "other_state"

    tp_rules = dict(layouts.DEFAULT_TP_RULES)
    a_state = _shard_tree(state, category, lambda ps, x: layouts.leaf_spec(
        ps, tuple(x.shape), x.dtype.itemsize, None, opts.layout, mesh_spec, tp_rules, issues), mesh, mesh_spec, leaves)
    a_batch = _shard_tree(batch, "batch", lambda ps, x: layouts.batch_spec(tuple(x.shape), mesh_spec, ps),
                          mesh, mesh_spec, leaves)

    def step(state, batch):
        return wl.step(state, batch)

    donated = wl.donate and opts.donate
    notes = [] if donated else ["state not donated (Workload(donate=False) or --no-donate)"]
    return BuiltStep(step, (a_state, a_batch), (0,) if donated else (), leaves, issues, mesh, donated, notes,
                     None)
