"""Pipeline parallelism: the model's scanned layers split into stages over the mesh's ``stage`` axis.

jaxmem builds the pipelined step itself, as MaxText's ``Pipeline`` module does on GPUs: one SPMD
program in which every device runs its stage. The model's loss is traced once at the size of one
microbatch; its top-level layer scan (``nn.scan``, ``nnx.scan``, ``jax.lax.scan`` over stacked
weights) is found in the jaxpr, and the loss is cut there into three parts:

* before the scan (embedding, masks, positions): run on all M microbatches at once (vmapped);
* the scan: L layers become N stages of R x k layers (k = L / (N R)); the stacked weights are
  sharded over ``stage`` on their layer dimension, so a device holds L / N layers. A loop of
  M R + N - 1 iterations runs every stage on its current microbatch (vmapped over stages, the
  stage dimension sharded over ``stage``), then shifts the stages' outputs one stage on (a
  collective permute): GPipe when R = 1; MaxText's circular pipeline when R > 1 (a microbatch
  that leaves the last stage comes back to the first for its next repeat);
* after the scan (final norm, head, loss): vmapped over the microbatches; the loss is their mean.

JAX differentiates the loop, so the backward pass runs after every microbatch's forward (the
GPipe schedule; MaxText's too), and XLA's buffer assignment holds the activations of the
microbatches in flight: under GPipe what the model's own remat policy saves, per microbatch
and layer; under the circular schedule each iteration is checkpointed at its input (MaxText saves
its ``iteration_input``) and its backward recomputes the stage's forward first, since the weights
it picks per repeat would otherwise be saved once per iteration.
Every stage runs every iteration, the bubble's included (the SPMD program computes and discards
it), so the compiled FLOPs already hold the bubble.

A stage runs the storage rows of its shard: stage s holds rows [s L/N, (s+1) L/N) of the stacked
weights and runs them as its R chunks. Under the circular schedule that numbers the layers in
another order than the model's (MaxText stores them as [repeats, stages, layers] instead); the
layers are identical in shape, so the memory and the FLOPs are the same.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import source_info_util
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem.errors import UserError
from jaxmem.program import sizes
from jaxmem.program.divisors import divisors
from jaxmem.program.tree import path_str

SCHEDULES = ("gpipe", "circular")
# primitives a parameter passes through unchanged on its way into the scan (casts, placement)
_PASS_THROUGH = ("convert_element_type", "copy", "copy_p", "sharding_constraint", "reduce_precision", "device_put")
# call-like primitives that may wrap the layer scan: looked into (their eqns inlined) when they hold it
_CALLS = ("pjit", "jit", "closed_call", "core_call")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the layers are split and run: N stages, M microbatches, R repeats of L layers."""

    kind: str          # gpipe | circular
    stages: int        # N
    microbatches: int  # M
    repeats: int       # R (1 under gpipe)
    layers: int = 0    # L, known once the layer scan is found (0 before)
    axis: str = "stage"
    stage_remat: bool = False   # each stage's pass checkpointed at its input (always under circular)

    @property
    def checkpointed(self) -> bool:
        """Each iteration's stage pass is checkpointed at its input (--stage-remat, or circular's repeats)."""
        return self.stage_remat or self.repeats > 1

    @property
    def per_chunk(self) -> int:
        """k: the layers a stage runs in one repeat."""
        return self.layers // (self.stages * self.repeats)

    @property
    def iterations(self) -> int:
        """The loop's trip count: every microbatch through every repeat, plus the fill and drain."""
        return self.microbatches * self.repeats + self.stages - 1

    @property
    def bubble(self) -> float:
        """The share of the stage time spent on no microbatch: (N-1) / (M R + N - 1)."""
        return (self.stages - 1) / self.iterations

    def stage_layers(self, s: int) -> list[int]:
        """The storage rows of the stacked weights stage s holds and runs (repeat by repeat)."""
        per_stage = self.layers // self.stages
        return list(range(s * per_stage, (s + 1) * per_stage))

    def in_flight(self) -> int:
        """Microbatches whose activations a stage holds when the backward starts: every one it ran
        (all forward, then all backward), M R, of which the last N - 1 iterations' are the bubble's."""
        return self.microbatches * self.repeats


def default_microbatches(stages: int, batch: int, data: int) -> int | None:
    """The smallest M >= N (every stage busy once the pipeline is full) that splits the batch into
    microbatches the data-parallel devices divide, a multiple of N where one does (MaxText's
    default is N; the embedding and head then split their microbatches over the stages); None
    when none does."""
    data = max(data, 1)
    if batch < 1 or batch % data:   # M microbatches of batch/M rows each split over the data devices: M | batch/data
        return None
    fits = [m for m in divisors(batch // data) if m >= stages]   # from the factors: a prime batch answers at once
    return next((m for m in fits if m % stages == 0), fits[0] if fits else None)


def resolve(kind: str, stages: int, microbatches: int | None, repeats: int | None, batch: int | None,
            data: int, axis: str, accum: int = 1, *, stage_remat: bool = False) -> tuple[Schedule, list[str]]:
    """The schedule the options ask for, checked against the batch (before any device exists), and
    the notes that say what was chosen for the user."""
    if kind not in SCHEDULES:
        raise UserError(f"--pipeline {kind!r}: known schedules are {', '.join(SCHEDULES)}")
    notes: list[str] = []
    if kind == "gpipe" and repeats not in (None, 1):
        raise UserError(f"--repeats {repeats}: repeats belong to the circular schedule; add --pipeline circular")
    if batch is None:
        raise UserError(f"--mesh {axis}=N: pipelining splits the batch into microbatches, and this workload's "
                        "batch has no leading dimension")
    per_step = batch // accum
    if microbatches is None:
        m = default_microbatches(stages, per_step, data)
        if m is None:
            raise UserError(f"--mesh {axis}={stages}: the batch of {per_step} per step cannot be split into at least "
                            f"{stages} microbatches (one per stage) that the {data} data-parallel devices divide; "
                            f"use a --batch that is a multiple of {stages * max(data, 1)}, or give --microbatches")
        notes.append(f"microbatches {m}: the smallest number that keeps all {stages} stages busy (--microbatches)")
    else:
        m = microbatches
        if per_step % m or (per_step // m) % max(data, 1):
            raise UserError(f"--microbatches {m}: the batch of {per_step} per step must split into {m} microbatches "
                            f"each divisible by the {data} data-parallel devices")
    if kind == "circular" and m < stages:
        raise UserError(f"--microbatches {m} with --pipeline circular: a microbatch comes back to the first stage "
                        f"for its next repeat, so the circular schedule needs at least one microbatch per stage "
                        f"({stages}); give --microbatches {stages} or more")
    r = 1 if kind == "gpipe" else repeats or 0   # 0: the circular default, one layer per stage per repeat
    chosen = f"--microbatches {m}" if microbatches is not None else f"{m:,} microbatches (the fewest that split it)"
    sizes.check_loop(m * max(r, 1) + stages - 1, f"--mesh {axis}={stages} with {chosen}: the pipeline's loop",
                     f"give --microbatches M (at least {stages}, at most {sizes.MAX_LOOP_ITERATIONS:,}) that splits "
                     f"the batch of {per_step:,} per step, or a --batch that is a multiple of {stages * max(data, 1)}")
    return Schedule(kind, stages, m, r, axis=axis, stage_remat=stage_remat), notes


# ------------------------------------------------------------------------------ finding the layer scan


@dataclasses.dataclass(frozen=True)
class LayerScan:
    """The top-level scan of the traced loss that runs the layers."""

    eqns: tuple                     # the loss's top-level equations, call wrappers around the scan inlined
    index: int                      # the scan's position in `eqns`
    length: int                     # L
    inputs: frozenset[int]          # the loss's flat inputs whose values are the scan's stacked xs


def _inline_calls(jaxpr) -> list:
    """The top-level equations, with jit/closed_call wrappers that hold a scan replaced by their own
    equations (their variables renamed onto the caller's), so that the layer scan is at the top."""
    out: list = []
    for eqn in jaxpr.eqns:
        inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
        if eqn.primitive.name in _CALLS and inner is not None and _holds_scan(inner):
            closed = inner if hasattr(inner, "consts") else None
            sub = closed.jaxpr if closed is not None else inner
            if closed is not None and closed.consts:
                out.append(eqn)   # constants inside: kept whole (no such wrapper was seen around a layer scan)
                continue
            rename = dict(zip(sub.invars, eqn.invars, strict=True))
            body = _inline_calls(sub)
            body = [_subst(e, rename) for e in body]
            # the wrapper's outputs are its jaxpr's outvars: alias them with an identity copy
            for outer, inner_v in zip(eqn.outvars, sub.outvars, strict=True):
                body.append(_Alias(outer, rename.get(inner_v, inner_v), eqn.source_info))
            out.extend(body)
        else:
            out.append(eqn)
    return out


def _holds_scan(j) -> bool:
    j = getattr(j, "jaxpr", j)
    for e in j.eqns:
        if e.primitive.name == "scan":
            return True
        inner = e.params.get("jaxpr") or e.params.get("call_jaxpr")
        if e.primitive.name in _CALLS and inner is not None and _holds_scan(inner):
            return True
    return False


class _Alias:
    """outvar := invar (a call wrapper's output is one of its body's variables)."""

    def __init__(self, outvar, invar, source_info):
        self.outvars, self.invars, self.source_info = [outvar], [invar], source_info
        self.primitive = None
        self.params: dict = {}


def _subst(eqn, rename: dict):
    if isinstance(eqn, _Alias):
        return _Alias(eqn.outvars[0], rename.get(eqn.invars[0], eqn.invars[0]), eqn.source_info)
    new_in = [rename.get(v, v) if _is_var(v) else v for v in eqn.invars]
    return eqn.replace(invars=new_in)


def _is_var(v) -> bool:
    return not hasattr(v, "val")   # Literals carry .val


def scan_inputs(eqn, items: Sequence) -> tuple[list, list, list]:
    """A scan's inputs (or anything aligned with them) as (consts, carry, xs): from num_consts and
    num_carry (jax before 0.12), or from the flat-tree structure ft_in of jax 0.12."""
    p = eqn.params
    if "num_consts" in p:
        nc, nk = p["num_consts"], p["num_carry"]
        return list(items[:nc]), list(items[nc:nc + nk]), list(items[nc + nk:])
    consts, carry, xs = p["ft_in"].update(list(items)).unpack()
    return list(consts), list(carry), list(xs)


def find_layer_scan(closed, n_stage_inputs: Sequence[bool]) -> LayerScan | None:
    """The scan whose stacked inputs (xs) come from the most parameter bytes: the layers.
    `n_stage_inputs[i]`: flat input i is a parameter (a candidate for the stacked weights)."""
    eqns = _inline_calls(closed.jaxpr)
    origin: dict[Any, int] = {v: i for i, v in enumerate(closed.jaxpr.invars) if n_stage_inputs[i]}
    best: tuple[int, int] | None = None   # (bytes, index)
    for idx, e in enumerate(eqns):
        if isinstance(e, _Alias):
            if _is_var(e.invars[0]) and e.invars[0] in origin:
                origin[e.outvars[0]] = origin[e.invars[0]]
            continue
        name = e.primitive.name
        if name in _PASS_THROUGH and len(e.invars) == 1 and _is_var(e.invars[0]) and e.invars[0] in origin:
            origin[e.outvars[0]] = origin[e.invars[0]]
        if name != "scan":
            continue
        xs = scan_inputs(e, e.invars)[2]
        nbytes = sum(math.prod(v.aval.shape) * v.aval.dtype.itemsize for v in xs
                     if _is_var(v) and v in origin and hasattr(v.aval, "shape"))
        if nbytes and (best is None or nbytes > best[0]):
            best = (nbytes, idx)
    if best is None:
        return None
    e = eqns[best[1]]
    xs = scan_inputs(e, e.invars)[2]
    return LayerScan(tuple(eqns), best[1], int(e.params["length"]),
                     frozenset(origin[v] for v in xs if _is_var(v) and v in origin))


# ------------------------------------------------------------------------------ replaying equations


def _eval(eqns, env: dict, base_stack) -> None:
    """Bind `eqns` in order, reading and writing `env` (jax.core.eval_jaxpr's loop, each equation under
    its own name stack on top of `base_stack`, so the buffers keep their module paths)."""
    for eqn in eqns:
        if isinstance(eqn, _Alias):
            env[eqn.outvars[0]] = _read(env, eqn.invars[0])
            continue
        with eqn.ctx.manager:
            ans = _bind(eqn, eqn.params, [_read(env, v) for v in eqn.invars], base_stack)
        if eqn.primitive.multiple_results:
            for v, a in zip(eqn.outvars, ans, strict=True):
                env[v] = a
        else:
            env[eqn.outvars[0]] = ans


def _bind(eqn, params: dict, args: Sequence, base_stack):
    """eqn's primitive bound to `args` with `params`, under eqn's own name stack on top of `base_stack`."""
    bind_params = eqn.primitive.get_bind_params(params)
    subfuns: tuple = ()
    if isinstance(bind_params, tuple):   # jax before 0.10: (subfuns, params)
        subfuns, bind_params = bind_params
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=base_stack + eqn.source_info.name_stack):
        return eqn.primitive.bind(*subfuns, *args, **bind_params)


def _read(env, v):
    return v.val if not _is_var(v) else env[v]


def _depends(eqns, seeds: set) -> set:
    """The variables computed from any of `seeds` (the batch)."""
    dep = set(seeds)
    for e in eqns:
        if any(_is_var(v) and v in dep for v in e.invars):
            dep.update(e.outvars)
    return dep


def _reads(eqns) -> set:
    return {v for e in eqns for v in e.invars if _is_var(v)}


# ------------------------------------------------------------------------------ the pipelined loss


def pipelined(loss_fn: Callable, sched: Schedule, mesh, batch_axes: tuple[str, ...] = (), *, batch_argnum: int = 3):
    """loss_fn(*args) -> (loss, aux), with the layer scan run as `sched`'s pipeline over the stage
    axis of `mesh`. The batch (argument `batch_argnum`) is split into M microbatches; the loss is
    their mean; aux must not depend on the batch (no mutable collections)."""

    def run(*args):
        flat, in_tree = jax.tree.flatten(args)
        n_batch = len(jax.tree.leaves(args[batch_argnum]))
        first = len(jax.tree.leaves(args[:batch_argnum]))
        is_batch = [first <= i < first + n_batch for i in range(len(flat))]
        M = sched.microbatches  # noqa: N806 -- the schedule's letters, as the docstrings write them
        # microbatch m takes rows m, m + M, ... of the batch: each data shard splits locally, no transfer
        micro_flat = [x.reshape((x.shape[0] // M, M) + x.shape[1:]).swapaxes(0, 1) if b else x
                      for x, b in zip(flat, is_batch, strict=True)]
        micro_abs = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) if b else jax.ShapeDtypeStruct(x.shape, x.dtype)
                     for x, b in zip(micro_flat, is_batch, strict=True)]
        closed, out_shape = jax.make_jaxpr(lambda *fl: loss_fn(*jax.tree.unflatten(in_tree, fl)),
                                           return_shape=True)(*micro_abs)
        params_in = [not b and jnp.issubdtype(a.dtype, jnp.floating) for a, b in zip(micro_abs, is_batch, strict=True)]
        found = find_layer_scan(closed, params_in)
        if found is None:
            raise no_scan_error(sched)
        base = source_info_util.current_name_stack()
        jaxpr = closed.jaxpr
        eqns = list(found.eqns)
        pre, scan, post = eqns[: found.index], eqns[found.index], eqns[found.index + 1:]
        dep = _depends(eqns, {v for v, b in zip(jaxpr.invars, is_batch, strict=True) if b})

        # before the scan: every microbatch at once (what does not depend on the batch, once)
        later = _reads([scan] + post) | {v for v in jaxpr.outvars if _is_var(v)}
        pre_out = list(dict.fromkeys(o for e in pre for o in e.outvars if o in later))   # in program order

        def pre_fn(consts, ins):
            env = dict(zip(jaxpr.constvars, consts, strict=True))
            env.update(zip(jaxpr.invars, ins, strict=True))
            _eval(pre, env, base)
            return [env[v] for v in pre_out]

        # MaxText's activation_embed_and_logits_batch: the embedding and the head split their batch over the
        # stages too (each stage M/N of the microbatches), where the microbatches divide among the stages
        spmd = sched.axis if M % sched.stages == 0 else None
        pre_vals = jax.vmap(pre_fn, in_axes=(None, [0 if b else None for b in is_batch]),
                            out_axes=[0 if v in dep else None for v in pre_out], spmd_axis_name=spmd)(
                                closed.consts, micro_flat)
        env: dict = dict(zip(jaxpr.constvars, closed.consts, strict=True))
        env.update(zip(jaxpr.invars, micro_flat, strict=True))
        env.update(zip(pre_out, pre_vals, strict=True))
        batched = set(dep)   # which env values carry the leading microbatch dimension

        with jax.named_scope("pipeline"):
            micro = next((x.shape[1] for x, b in zip(micro_flat, is_batch, strict=True) if b and x.ndim > 1), None)
            scan_out = _pipeline_loop(scan, env, batched, sched, mesh, base, _batch_entry(mesh, batch_axes, micro))
        # the final carry and the per-layer outputs (ys, in layer order), per microbatch
        env.update(zip(scan.outvars, scan_out, strict=True))
        reads = [v for v in (*(v for e in post for v in e.invars), *jaxpr.outvars) if _is_var(v)]
        post_in = [v for v in dict.fromkeys(reads) if v in env]   # what the rest reads from before it, in order

        def post_fn(vals):
            e2 = dict(zip(post_in, vals, strict=True))
            _eval(post, e2, base)
            return [_read(e2, v) for v in jaxpr.outvars]

        out_dep = [_is_var(v) and v in dep for v in jaxpr.outvars]
        outs = jax.vmap(post_fn, in_axes=([0 if v in batched else None for v in post_in],),
                        out_axes=[0 if d else None for d in out_dep], spmd_axis_name=spmd)([env[v] for v in post_in])
        loss_leaves = len(jax.tree.leaves(out_shape[0]))
        if any(out_dep[loss_leaves:]):
            raise UserError("pipelining: the model updates state that depends on the batch (mutable collections "
                            "such as BatchNorm statistics); jaxmem's pipeline splits the batch into microbatches "
                            "and keeps no such state. Drop the stage axis, or give the step yourself")
        losses = [jnp.mean(o, axis=0) if d else o for o, d in zip(outs[:loss_leaves], out_dep, strict=False)]
        aux_tree = jax.tree.structure(out_shape)
        return jax.tree.unflatten(aux_tree, losses + list(outs[loss_leaves:]))

    return run


def layer_leaves(loss_fn: Callable, st, sched: Schedule) -> tuple[frozenset[str], int]:
    """(the paths of the parameters that are the stacked layers, L): the loss traced once on one
    microbatch, abstractly, and its layer scan found."""

    micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct((st.micro_size,) + tuple(x.shape[1:]), x.dtype)
                         if x.shape else x, st.batch)
    key = jax.eval_shape(lambda: jax.random.key(0))
    paths = [path_str(p) for tree in (st.trainable, st.frozen)
             for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    closed = jax.make_jaxpr(loss_fn)(st.trainable, st.frozen, st.mutable, micro, key)
    flat = jax.tree.leaves((st.trainable, st.frozen, st.mutable, micro, key))
    found = find_layer_scan(closed, [i < len(paths) and jnp.issubdtype(x.dtype, jnp.floating)
                                     for i, x in enumerate(flat)])
    if found is None:
        raise no_scan_error(sched)
    return frozenset(paths[i] for i in found.inputs), found.length


def no_scan_error(sched: Schedule) -> UserError:
    return UserError(f"--mesh {sched.axis}={sched.stages}: pipelining splits the model's layer scan into stages, and "
                     "this model runs no scan over stacked layer weights (its layers are a Python loop). Scan the "
                     "layers (nn.scan or nnx.scan with the parameters on a leading layer axis, as MaxText's decoder "
                     "does), or drop the stage axis (fold its devices into fsdp or data)")


def check_layers(length: int, sched: Schedule) -> None:
    n, r = sched.stages, sched.repeats or length // sched.stages
    if length % n:
        raise UserError(f"--mesh {sched.axis}={n}: the layer scan has {length} layers, which {n} stages cannot split "
                        f"evenly; use a stage count that divides {length}")
    if length % (n * r):
        raise UserError(f"--repeats {r}: {length} layers over {n} stages make {length // n} layers per stage, which "
                        f"{r} repeats cannot split evenly; use a --repeats that divides {length // n}")


def with_layers(sched: Schedule, length: int) -> Schedule:
    """The schedule once the layer count is known (the circular default: one layer per stage per repeat)."""
    check_layers(length, sched)
    r = sched.repeats or length // sched.stages
    return dataclasses.replace(sched, layers=length, repeats=r)


def _batch_entry(mesh, batch_axes: tuple[str, ...], micro: int | None):
    """(the PartitionSpec entry of a microbatch's batch dimension, its size): the data-parallel axes."""
    axes = tuple(a for a in batch_axes if mesh.shape[a] > 1)
    if not axes or micro is None:
        return None, micro
    return (axes[0] if len(axes) == 1 else axes), micro


def _pipeline_loop(scan, env: dict, batched: set, sched: Schedule, mesh, base, batch=(None, None)) -> list:
    """The stages' loop over M R + N - 1 iterations; the final carry of every microbatch, (M, ...).
    `batch`: (spec entry, size) of a microbatch's batch dimension: the buffers that hold microbatches
    keep it split over the data-parallel axes (left open, XLA gathers whole batches onto every device)."""
    N, M = sched.stages, sched.microbatches  # noqa: N806 -- the schedule's letters
    sched = with_layers(sched, int(scan.params["length"]))
    R, k = sched.repeats, sched.per_chunk  # noqa: N806 -- the schedule's letters
    consts, carries, xs = scan_inputs(scan, scan.invars)
    if any(_is_var(v) and v in batched for v in xs):
        raise UserError("the layer scan's per-layer inputs depend on the batch; jaxmem pipelines a scan over "
                        "stacked weights whose per-microbatch state is its carry")
    constrain = _constrainer(mesh, batch)

    # stacked weights (L, ...) -> (N, R, k, ...): stage s's own rows, local to its shard
    # (GPipe takes [:, 0] of it: a (N, k, ...) reshape instead made XLA gather every layer once per fsdp shard)
    w = [constrain(_read(env, v).reshape((N, R, k) + _read(env, v).shape[1:]), (sched.axis,)) for v in xs]
    const_vals = [_read(env, v) for v in consts]
    const_dep = [_is_var(v) and v in batched for v in consts]
    # the first stage's inputs, per microbatch (a carry the batch does not reach is the same for each)
    x_in = [constrain(_read(env, v) if (_is_var(v) and v in batched) else jnp.broadcast_to(_read(env, v), (M,) +
            jnp.shape(_read(env, v))), (None,)) for v in carries]
    stages = _stage_pass(scan, base, sched, const_vals, const_dep, len(carries))
    body = _loop_body(sched, stages, w, const_vals, const_dep, constrain)

    # per-layer outputs (ys, e.g. a MoE layer's load-balancing loss): (M, N, R, k, ...), written by each
    # stage for its microbatch and repeat, read after the loop in layer order
    ys_avals = [v.aval for v in scan.outvars[len(carries):]]
    zeros = [jnp.zeros((N,) + x.shape[1:], x.dtype) for x in x_in]
    state0 = [constrain(z, (sched.axis,)) for z in zeros]
    circ0 = [constrain(jnp.zeros_like(x), (None,)) for x in x_in] if R > 1 else []
    outs0 = [constrain(jnp.zeros_like(x), (None,)) for x in x_in]
    ys0 = [jnp.zeros((M, N, R, k) + a.shape[1:], a.dtype) for a in ys_avals]
    T = sched.iterations  # noqa: N806 -- the schedule's letters
    (_, _, _, outs, ys_buf), _ = jax.lax.scan(body, (state0, x_in, circ0, outs0, ys0), jnp.arange(T))
    outs = [constrain(jnp.roll(o, T % M, axis=0), (None,)) for o in outs]   # position (m - T) % M holds m
    return outs + [y.reshape((M, N * R * k) + y.shape[4:]) for y in ys_buf]


def _constrainer(mesh, batch):
    """constrain(x, lead): x's leading dimensions on `lead`'s axes, a microbatch's batch dimension (right
    after `lead`) on the data-parallel axes, the rest left to XLA."""

    def constrain(x, lead: tuple):
        if batch[0] is not None and x.ndim > len(lead) and x.shape[len(lead)] == batch[1]:
            lead = lead + (batch[0],)
        rest = (P.UNCONSTRAINED,) * (x.ndim - len(lead))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*lead, *rest)))

    return constrain


def _pick(a, i):
    return jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False)


def _stage_pass(scan, base, sched: Schedule, const_vals: list, const_dep: list, nk: int):
    """stages(w, r, c_now, inp) -> (carries out, ys): every stage's k layers at once (vmapped over the
    stage axis), each on its repeat r's rows of the weights and its microbatch's batch-dependent consts.

    GPipe: a stage's weights are the same every iteration, and what the backward keeps per microbatch
    is what the model's own remat policy saves. Circular: the repeat's rows are picked per iteration, and
    saved whole each iteration would keep its own copy of them; so each iteration is checkpointed at its
    inputs (the microbatch that entered the stage, MaxText's iteration_input) and the backward recomputes
    the stage's forward first. --stage-remat asks for that under GPipe too (Pax's pipeline remat)."""
    params = dict(scan.params, length=sched.per_chunk)
    R = sched.repeats  # noqa: N806 -- the schedule's letters

    def stage_fn(w_stage, c_dep, carry):
        it = iter(c_dep)
        cs = [next(it) if d else c for c, d in zip(const_vals, const_dep, strict=True)]
        out = _bind(scan, params, [*cs, *carry, *w_stage], base)
        return list(out[:nk]), list(out[nk:])

    def _run_stages(w, r, c_now, inp):
        w_now = [wx[:, 0] if R == 1 else jax.vmap(_pick)(wx, r) for wx in w]
        return jax.vmap(stage_fn, spmd_axis_name=sched.axis)(w_now, c_now, inp)

    return _run_stages if not sched.checkpointed else jax.checkpoint(
        _run_stages, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False)


def _loop_body(sched: Schedule, stages, w: list, const_vals: list, const_dep: list, constrain):
    """One iteration t of the loop: every stage on its work item, outputs passed one stage on.

    The microbatch buffers (the first stage's inputs, the finished outputs, and under circular the
    microbatches between repeats) turn by one microbatch per iteration instead of being indexed by it:
    position p holds microbatch (t + p) % M, the first stage reads position 0 and the last stage writes
    position (M - N + 1) % M. Static slices of a dimension no axis splits stay on each device; an index
    that changes per iteration made XLA gather whole buffers across the data-parallel devices."""
    N, M, R, ax = sched.stages, sched.microbatches, sched.repeats, sched.axis  # noqa: N806 -- the schedule's letters
    ids = jnp.arange(N)
    pw = (M - N + 1) % M

    def turn(a):
        return constrain(jnp.roll(a, -1, axis=0), (None,))

    def put(buf, y, mi, s, ri, ok):             # one stage's ys into buf[m, s, r]
        old = buf[mi, s, ri]
        return buf.at[mi, s, ri].set(jnp.where(ok, y, old))

    def body(loop, t):
        state, feed, circ, outs, ys_buf = loop
        u = t - ids                                 # each stage's work item: repeat u // M, microbatch u % M
        r = jnp.clip(u // M, 0, R - 1)
        m = u % M
        r0 = t // M
        first = [constrain(f[0] if R == 1 else jnp.where(r0 == 0, f[0], c[0]), ())
                 for f, c in zip(feed, circ or feed, strict=True)]
        inp = [constrain(jnp.where((ids == 0).reshape((N,) + (1,) * f.ndim), f[None], s), (ax,))
               for f, s in zip(first, state, strict=True)]
        c_now = [jax.vmap(lambda i, c=c: _pick(c, i))(m) for c, d in zip(const_vals, const_dep, strict=True) if d]
        out, ys = stages(w, r, c_now, inp)
        out = [constrain(o, (ax,)) for o in out]
        live = (u >= 0) & (u < M * R)               # bubble iterations write nothing
        for i, y in enumerate(ys):
            for s in range(N):
                ys_buf[i] = put(ys_buf[i], y[s], m[s], s, r[s], live[s])
        ul = t - (N - 1)                            # the last stage's work item
        rl, valid = ul // M, ul >= 0
        last = [o[N - 1] for o in out]
        done = valid & (rl == R - 1)
        outs = [turn(a.at[pw].set(jnp.where(done, x, a[pw]))) for a, x in zip(outs, last, strict=True)]
        if R > 1:
            again = valid & (rl < R - 1)
            circ = [turn(a.at[pw].set(jnp.where(again, x, a[pw]))) for a, x in zip(circ, last, strict=True)]
        feed = [turn(f) for f in feed]
        # each stage's output moves on to the next stage (the last one's wraps to the first: overwritten)
        state = [constrain(jnp.roll(o, 1, axis=0), (ax,)) for o in out]
        return (state, feed, circ, outs, ys_buf), None

    return body
