"""Where every leaf of the abstract state lives: its PartitionSpec (from the layout rules
in ``rules.py``) and memory kind, and the sharding constraints on activations.

`shard_state` turns an :class:`~jaxmem.program.state.AbstractState` into the step's
arguments (``ShapeDtypeStruct``s carrying ``NamedSharding``s), one :class:`LeafInfo`
per argument leaf in flattened order, and the output shardings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np
from flax.linen import spmd as linen_spmd
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem import errors
from jaxmem.program import layouts
from jaxmem.program import rules as rules_mod
from jaxmem.program.state import AbstractState
from jaxmem.program.tree import path_str
from jaxmem.report import ReportWarning


@dataclasses.dataclass(frozen=True)
class LeafInfo:
    path: str
    category: str                   # params | optimizer_state | other_state | batch
    shape: tuple[int, ...]
    dtype: str
    itemsize: int                   # numpy's bytes per element (1 for the 4-bit types)
    spec: tuple                     # PartitionSpec entries
    shards: int                     # how many ways the leaf is split
    trainable: bool | None = None   # params: differentiated and updated (None: a custom step's, unknown)
    memory_kind: str = "device"     # "device" | "pinned_host"
    bits: int | None = None         # storage bits per element; None: 8 * itemsize

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def global_bytes(self) -> int:
        return self._bytes(self.size)

    @property
    def device_bytes(self) -> int:
        return self._bytes(self.size // self.shards)

    def _bytes(self, n: int) -> int:
        # XLA packs sub-byte types (int4, uint4: two per byte); whole-byte types are n * itemsize
        bits = self.bits or 8 * self.itemsize
        return -(-n * bits // 8)


class StepArgs(NamedTuple):
    """The built step's arguments, by name: the one place their order is written."""

    trainable: Any
    frozen: Any        # read, never written: the only argument not donated
    opt_state: Any
    mutable: Any
    rng: Any
    batch: Any


class StepOut(NamedTuple):
    """The built step's results: the new state, and the loss."""

    trainable: Any
    opt_state: Any
    mutable: Any
    rng: Any
    loss: Any


@dataclasses.dataclass
class ShardedState:
    """The step's arguments (StepArgs), abstract and sharded, with what each leaf is."""

    trainable: Any
    frozen: Any
    opt_state: Any
    mutable: Any
    rng: Any
    batch: Any
    leaves: list[LeafInfo]
    issues: list[layouts.ShardingIssue]
    rules: rules_mod.RuleSet

    @property
    def args(self) -> StepArgs:
        return StepArgs(self.trainable, self.frozen, self.opt_state, self.mutable, self.rng, self.batch)

    def shardings(self, tree):
        return jax.tree.map(lambda a: a.sharding, tree)


def shard_tree(tree, category, spec_fn, mesh, mesh_spec, leaves: list[LeafInfo], *, trainable: bool | None = None,
               memory_kind: str = "device"):
    """ShapeDtypeStructs with NamedShardings for every leaf; each leaf recorded in `leaves`.

    `category` is a name or a function of the leaf path (the escape hatch sorts its state).
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    out = []
    # On real devices the argument is declared in host memory. Deviceless topology devices list no
    # memories and JAX drops the kind (docs/how-it-works.md, "Host offload"): the step's own
    # device_put to jax.memory.Space.Host, donated, is what places it there for XLA.
    kind = None if memory_kind == "device" else memory_kind
    for path, x in flat:
        ps = path_str(path)
        spec = spec_fn(ps, x)
        cat = category(ps) if callable(category) else category
        leaves.append(LeafInfo(f"{cat}:{ps}", cat, tuple(x.shape), str(x.dtype), x.dtype.itemsize, spec,
                               mesh_spec.axis_size(layouts.used_axes(spec)), trainable, memory_kind,
                               _storage_bits(x.dtype)))
        out.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P(*spec), memory_kind=kind)))
    return jax.tree_util.tree_unflatten(treedef, out)


def _storage_bits(dtype) -> int:
    """Bits per element as XLA stores it: 4 for int4/uint4; typed PRNG keys by their key data."""
    try:
        return jax.dtypes.itemsize_bits(dtype)
    except ValueError:
        return 8 * dtype.itemsize


def param_specs(st: AbstractState, rules: rules_mod.RuleSet, mesh_spec, issues,
                stage: tuple[str, frozenset[str]] | None = None) -> dict[str, tuple[tuple, tuple]]:
    """Path -> (shape, PartitionSpec entries) for every parameter, trainable or frozen. `stage`:
    (the stage axis, the stacked layers' paths): their layer dimension (0) split over the stages,
    the rest by the rules as for any leaf."""

    def names_for(path_keys):
        try:
            node = st.param_names
            for k in path_keys:
                if node is None or isinstance(node, P):  # NNX: the Variable's names, its /value below
                    break
                if isinstance(k, jax.tree_util.GetAttrKey):  # qwix's WithAux / QArray
                    node = getattr(node, k.name)
                else:
                    node = node[getattr(k, "key", getattr(k, "idx", None))]
            return tuple(node) if node is not None else None
        except (KeyError, IndexError, TypeError, AttributeError):
            return None

    out: dict[str, tuple[tuple, tuple]] = {}
    rules = written_only(st, rules)
    for tree in (st.trainable, st.frozen):
        for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
            ps = path_str(path)
            names = names_for(path)
            stage_axis = stage[0] if stage is not None and ps in stage[1] else None
            if stage_axis:   # the rules never split a dimension named layers: it is the stage axis's
                names = ("layers",) + tuple(names[1:] if names else (None,) * (len(x.shape) - 1))
            spec = rules_mod.leaf_spec(ps, tuple(x.shape), x.dtype.itemsize, names, rules, mesh_spec, issues)
            if stage_axis:
                spec = (stage_axis,) + tuple(spec[1:])
            out[ps] = (tuple(x.shape), spec)
    return out


def written_only(st: AbstractState, rules: rules_mod.RuleSet) -> rules_mod.RuleSet:
    """Explicit axes on a model that annotates its parameters: the annotations are the layout, as
    jax.make_mesh + the model's init place them; a leaf they leave open stays replicated (the layout's
    fallback split would be one the model's ops do not know of: a bias split over fsdp makes its add
    ill-typed). The rules still apply to the names they map. A model that annotates nothing (linen code
    for explicit axes cannot: nn.with_partitioning asserts there) leaves its placement to the layout."""
    if not rules.as_written or not rules.fallback:
        return rules
    annotated = any(isinstance(x, (P, tuple)) and any(e is not None for e in x)
                    for x in jax.tree.leaves(st.param_names, is_leaf=lambda x: isinstance(x, P)))
    return dataclasses.replace(rules, fallback=()) if annotated else rules


def shard_state(st: AbstractState, rules: rules_mod.RuleSet, mesh, mesh_spec: layouts.MeshSpec, *,
                stage: tuple[str, frozenset[str]] | None = None) -> ShardedState:
    issues: list[layouts.ShardingIssue] = []
    leaves: list[LeafInfo] = []
    rules = written_only(st, rules)
    specs = param_specs(st, rules, mesh_spec, issues, stage)

    def opt_spec(ps: str, x) -> tuple:
        # optax states mirror the params tree ('0/mu/<param path>'): the same path suffix and
        # shape -> the param's spec; anything else (counts, factored moments) by the fallback rule.
        parts = ps.split("/")
        for i in range(len(parts)):
            hit = specs.get("/".join(parts[i:]))
            if hit is not None and hit[0] == tuple(x.shape):
                return hit[1]
        return rules_mod.leaf_spec(ps, tuple(x.shape), x.dtype.itemsize, None, rules, mesh_spec, [])

    def tree(t, category, spec_fn, **kw):
        return shard_tree(t, category, spec_fn, mesh, mesh_spec, leaves, **kw)

    replicated = lambda ps, x: (None,) * len(x.shape)  # noqa: E731
    a_train = tree(st.trainable, "params", lambda ps, x: specs[ps][1], trainable=True)
    a_frozen = tree(st.frozen, "params", lambda ps, x: specs[ps][1], trainable=False)
    a_opt = tree(st.opt_state, "optimizer_state", opt_spec, memory_kind=st.opt_memory)
    a_mut = tree(st.mutable, "other_state", replicated)
    a_rng = tree(st.rng, "other_state", replicated)
    a_batch = tree(st.batch, "batch", lambda ps, x: layouts.batch_spec(tuple(x.shape), mesh_spec, ps))
    return ShardedState(a_train, a_frozen, a_opt, a_mut, a_rng, a_batch, leaves, issues, rules)


# ---------------------------------------------------------------- activations


def activation_rules(rules: rules_mod.RuleSet) -> tuple:
    """The flax logical-axis rules for the activations the model constrains itself
    (nn.with_logical_constraint): the user's, then the layout's (rules.activation_rules)."""
    return rules.activations


@contextlib.contextmanager
def in_context(mesh):
    """`mesh` as the context mesh, every way a training loop sets one: `with mesh:` (what libraries
    that read pxla.thread_resources see: eformer's get_incontext_mesh), then jax.set_mesh (or
    jax.sharding.use_mesh where this jax has that instead): bare-PartitionSpec constraints and
    get_abstract_mesh() resolve to it, as in the user's training run."""

    with contextlib.ExitStack() as stack:
        with warnings.catch_warnings():   # jax >= 0.7 deprecates `with mesh:`; trainers still use it
            warnings.simplefilter("ignore", DeprecationWarning)
            stack.enter_context(mesh)
        setter = getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh", None)
        if setter is not None:
            stack.enter_context(setter(mesh))
        stack.enter_context(target_devices(mesh))
        yield


def target_devices(mesh):
    """jax's device queries answer with the mesh's (the target's) devices: :func:`device_queries`."""
    return device_queries(lambda: list(mesh.devices.flat))


@contextlib.contextmanager
def device_queries(target: Callable[[], list]):
    """jax's device queries answer as on the machine trained on: `jax.devices()`, `jax.local_devices()`,
    their counts and `jax.default_backend()` are the target's devices and platform. Model code that asks
    which platform it runs on (tunix's shard() skips its constraints when jax.devices()[0] is a CPU) or
    builds its own mesh from the devices it sees (EasyDeL's config takes jax.default_backend(), eformer's
    create_mesh jax.device_count() and jax.devices(backend)) gets the trainer's answer, not this
    process's CPU. `target` is called on the first query (a model that asks nothing makes no target);
    when its devices are this process's own platform's, every query is jax's own. jax's internals
    (which call xla_bridge, not these names) are untouched."""
    orig = {name: getattr(jax, name) for name in DEVICE_QUERIES}
    made: list[list] = []

    def targets() -> list | None:   # the target's devices; None where jax's own answer is the target's
        if not made:
            made.append([])   # while the target is made (it may ask jax which GPUs are attached): jax's answers
            devices = list(target())
            made[0] = devices if devices and devices[0].platform != orig["devices"]()[0].platform else []
        return made[0] or None

    def ours(backend) -> list | None:
        # asked for the default backend ("" or None, as eformer's create_mesh asks) or the target's platform
        devices = targets()
        return devices if devices and (not backend or str(backend).lower() in ("gpu", "cuda", devices[0].platform)) \
            else None

    def local(devices: list, process_index=None) -> list:
        index = devices[0].process_index if process_index is None else process_index
        return [d for d in devices if d.process_index == index]

    def devices(backend=None):
        d = ours(backend)
        return orig["devices"](backend) if d is None else list(d)

    def device_count(backend=None):
        d = ours(backend)
        return orig["device_count"](backend) if d is None else len(d)

    def local_devices(process_index=None, backend=None, host_id=None):
        d = ours(backend)
        return orig["local_devices"](process_index, backend, host_id) if d is None or host_id is not None \
            else local(d, process_index)

    def local_device_count(backend=None):
        d = ours(backend)
        return orig["local_device_count"](backend) if d is None else len(local(d))

    def default_backend():
        d = targets()
        return orig["default_backend"]() if d is None else d[0].platform

    answers = {"devices": devices, "device_count": device_count, "local_devices": local_devices,
               "local_device_count": local_device_count, "default_backend": default_backend}
    for name, fn in answers.items():
        setattr(jax, name, fn)
    try:
        yield
    finally:
        for name, fn in orig.items():
            setattr(jax, name, fn)


DEVICE_QUERIES = ("devices", "device_count", "local_devices", "local_device_count", "default_backend")


@contextlib.contextmanager
def tracing(mesh, rules):
    """The context the step is traced in: the mesh (:func:`in_context`) and the logical-axis rules."""

    with in_context(mesh), nn.logical_axis_rules(rules):
        yield


@contextlib.contextmanager
def step_tracing(mesh, rules, used: dict[str, list[str]], check: Callable[[], None]):
    """The step's trace (:func:`tracing`), recording the logical names its constraints use into `used`
    (:func:`recording_names`); `check` runs once the trace and lowering succeeded, before any compile."""
    with tracing(mesh, rules), recording_names(used):
        yield
    check()


@contextlib.contextmanager
def recording_names(used: dict[str, list[str]]):
    """While active, every logical name flax resolves to mesh axes (nn.with_logical_constraint, a
    LogicallyPartitioned box's unbox) is added to `used` with the model's line that used it. flax has no
    hook for this: its one resolver, flax.linen.spmd._logical_to_mesh_axes, is wrapped for the duration."""
    orig = getattr(linen_spmd, "_logical_to_mesh_axes", None)
    if orig is None:   # a flax without it: nothing is recorded (the names of parameters still are)
        yield
        return

    def recorded(array_dim_names, rules=None):
        for name in array_dim_names or ():
            if isinstance(name, str):
                places = used.setdefault(name, [])
                if len(places) < rules_mod.MAX_PLACES:
                    at = _caller()
                    if at and at not in places:
                        places.append(at)
        return orig(array_dim_names, rules)

    linen_spmd._logical_to_mesh_axes = recorded
    try:
        yield
    finally:
        linen_spmd._logical_to_mesh_axes = orig


def _caller() -> str | None:
    """`file:line in function` of the innermost frame of the model's code (outside jax, flax, jaxmem)."""
    f: Any = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name and not name.startswith("<") and not errors.framework_file(name) and not errors.in_package(name):
            code = f.f_code   # the qualified name, as jax's tracebacks name the function (model_constraints)
            return f"{errors.short_path(name)}:{f.f_lineno} in {getattr(code, 'co_qualname', code.co_name)}"
        f = f.f_back
    return None


def param_name_places(st: AbstractState) -> dict[str, list[str]]:
    """Each logical name the parameters carry -> the parameters that carry it (their paths)."""
    used: dict[str, list[str]] = {}
    is_names = lambda x: isinstance(x, (P, tuple))  # noqa: E731
    for path, spec in jax.tree_util.tree_flatten_with_path(st.param_names, is_leaf=is_names)[0]:
        if not is_names(spec):
            continue
        for i, entry in enumerate(spec):
            for name in (entry,) if isinstance(entry, str) else entry or ():
                places = used.setdefault(name, [])
                if len(places) < rules_mod.MAX_PLACES:
                    places.append(f"parameter {path_str(path)} dim {i}")
    return used


MAX_CONSTRAINT_SITES = 8   # the report lists this many places; the count is of all of them


def model_constraints(jaxpr) -> dict[str, Any]:
    """The activation sharding constraints the model applied itself in the traced step (its own
    with_sharding_constraint / nn.with_logical_constraint calls, not jaxmem's): `count` (in the
    step, the backward's included), and each place (`at`: file:line in function, the first frame
    outside jax/flax) with its spec, the most used first."""

    sites: dict[tuple[str, str], int] = {}
    whole: dict[tuple[str, str], list[int]] = {}   # constraints that keep the leading dimension whole
    count = 0
    for eqn in equations(jaxpr):
        if eqn.primitive.name != "sharding_constraint":
            continue
        at = _model_frame(eqn, errors)
        if at is None:
            continue
        sharding = eqn.params.get("sharding")
        spec = getattr(sharding, "spec", sharding)
        key = (at, re.sub(r"^PartitionSpec\(", "P(", str(spec)))   # jax 0.9 prints PartitionSpec(...), later P(...)
        sites[key] = sites.get(key, 0) + 1
        count += 1
        shape = tuple(getattr(getattr(eqn.invars[0], "aval", None), "shape", ()) or ())
        if shape and (not len(spec) or spec[0] is None) and len(whole) < MAX_CONSTRAINT_SITES:
            whole.setdefault(key, list(shape))
    ranked = sorted(sites.items(), key=lambda kv: -kv[1])
    return {"count": count, "sites": len(sites),
            "applied": [{"at": at, "spec": spec, "count": n} for (at, spec), n in ranked[:MAX_CONSTRAINT_SITES]],
            "leading_whole": [{"at": at, "spec": spec, "shape": shape} for (at, spec), shape in whole.items()]}


def equations(jaxpr):
    """Every equation of a (closed) jaxpr and of the jaxprs in its equations' parameters."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in getattr(jaxpr, "eqns", ()):
        yield eqn
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    yield from equations(sub)


def _model_frame(eqn, errors) -> str | None:
    """`file:line in function` of the model's call that made `eqn`: its innermost frame outside the
    frameworks; None when that frame is jaxmem's (its own constraints) or unknown."""
    tb = getattr(eqn.source_info, "traceback", None)
    for f in getattr(tb, "frames", None) or ():
        name = getattr(f, "file_name", "")
        if not name or name.startswith("<") or errors.framework_file(name):
            continue
        if errors.in_package(name):
            return None
        return f"{errors.short_path(name)}:{getattr(f, 'line_num', '?')} in {getattr(f, 'function_name', '?')}"
    return None


def activation_constraints(mesh, mesh_spec, layout, micro_batch, seq_len, nnx_model, model):
    """Keep module outputs whose leading dim is the batch sharded over the batch axes, and their
    sequence dim (dim 1, when it is the batch's sequence length) over the context axis.

    Without them XLA gathers whole-batch activations instead of weights under FSDP
    (benchmarks/results/fsdp-constraints-1b.md: 7.1x the temporaries on a 1B Llama).
    dp/fsdp: the other dims replicated (what FSDP runs); tp layouts: the other dims
    left to XLA (Megatron splits them inside attention/MLP).
    """
    data = mesh_spec.batch_axes
    ctx = mesh_spec.context_axis if mesh_spec.axis_size(mesh_spec.context_axis) > 1 and seq_len else None
    if ((not data or mesh_spec.data_size == 1) and ctx is None) or micro_batch is None:
        return contextlib.nullcontext()
    lead = layouts.spec_axes(data) if data and mesh_spec.data_size > 1 else None
    rest = None if layout in ("dp", "fsdp") else P.UNCONSTRAINED

    def one(x):
        if isinstance(x, jax.Array) and x.ndim >= 1 and x.shape[0] == micro_batch:
            spec = [lead] + [rest] * (x.ndim - 1)
            if ctx is not None and x.ndim >= 2 and x.shape[1] == seq_len:
                spec[1] = ctx
            return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))
        return x

    return module_outputs(model if nnx_model else None, lambda out: jax.tree.map(one, out))


@contextlib.contextmanager
def module_outputs(model, fn: Callable[[Any], Any], which: Callable[[type], bool] | None = None):
    """While active, Flax module calls return ``fn(output)``.

    linen (``model`` None): every method but ``setup``, through ``nn.intercept_methods``.
    NNX has no method interceptor, so each module class in ``model``'s graph has its
    ``__call__`` wrapped for the duration (restored on exit). ``which`` narrows it to the
    ``__call__`` of the module classes it accepts.
    """
    if model is None:
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

    from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

    saved = {}
    classes = {type(m) for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Module)}
    for cls in (c for c in classes if which is None or which(c)):
        orig = cls.__dict__.get("__call__")
        if orig is None:
            continue
        saved[cls] = orig

        def wrapped(self, *a, __orig=orig, **k):
            return fn(__orig(self, *a, **k))

        cls.__call__ = wrapped  # type: ignore[method-assign]  # for this trace only: restored below
    try:
        yield
    finally:
        for cls, orig in saved.items():
            cls.__call__ = orig  # type: ignore[method-assign]


def check_unsharded(issues, leaves) -> list[ReportWarning]:
    """unsharded_leaf: each leaf the layout could not shard, largest first, with the optimizer-state
    copies that stay replicated with it in its cost."""
    out = []
    issues = [i for i in issues if i.kind == "replicated"]   # a poor split is jaxmem.program.visible's
    for issue, moments in sorted(_with_moments(issues, leaves), key=lambda im: -im[0].replicated_bytes):
        also = f" (so do its {moments} optimizer-state copies: {moments + 1}x the bytes)" if moments else ""
        out.append(ReportWarning(
            "unsharded_leaf", f"{issue.leaf} {issue.shape} stays replicated on {issue.axis}{also}: {issue.reason}",
            issue.replicated_bytes * (moments + 1)))
    return out


def _with_moments(issues, leaves) -> list[tuple]:
    """Each sharding issue of a parameter with the optimizer-state leaves that mirror it (Adam's mu and
    nu: the same path and shape, sharded as it is): they stay replicated with it."""
    params = {(leaf.path.split(":", 1)[-1], tuple(leaf.shape)) for leaf in leaves if leaf.category == "params"}
    copies: dict[tuple[str, tuple], int] = {}
    for leaf in leaves:
        if leaf.category != "optimizer_state":
            continue
        parts = leaf.path.split(":", 1)[-1].split("/")
        # the longest tail of its path that is a parameter's (optax nests the params' tree under mu/, nu/)
        key = next((k for k in (("/".join(parts[i:]), tuple(leaf.shape)) for i in range(1, len(parts)))
                    if k in params), None)
        if key is not None:
            copies[key] = copies.get(key, 0) + 1
    return [(i, copies.get((i.leaf, tuple(i.shape)), 0)) for i in issues]
