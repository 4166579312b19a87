"""The jitted training step over the abstract, sharded state.

The step is what a competent user runs: forward + loss + backward + optax update,
the train state donated, gradients sharded like the params, and (for layouts with
data axes) every module output whose leading dim is the batch kept batch-sharded,
so that XLA gathers weights layer by layer instead of whole-batch activations.

Two stages: :func:`plan` checks and resolves everything the options and the batch's shapes
decide, before any device exists (a 10000-device mesh takes minutes to create, and a batch
divisibility error must not wait for it); :func:`build` assembles the planned step on a mesh
and checks nothing. It composes three pieces: ``state.abstract_state`` (which leaves exist,
trainable or frozen), ``sharding.shard_state`` (their PartitionSpecs and memory kinds) and
:func:`train_step` here (the function over them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem import errors
from jaxmem.errors import UserError
from jaxmem.program import calls as calls_mod
from jaxmem.program import finetune, fp8, layouts, pipeline_stages, sharding, sizes, state, tree, user_specs
from jaxmem.program import rules as rules_mod
from jaxmem.program import workload as workload_mod
from jaxmem.program.options import PRECISIONS, StepOptions
from jaxmem.program.sharding import LeafInfo, StepArgs, StepOut, module_outputs  # noqa: F401  (public names of the step)
from jaxmem.program.state import OPTIMIZERS, is_nnx  # noqa: F401  (public names of the step)
from jaxmem.program.workload import Workload
from jaxmem.report import ReportWarning


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
    trace_context: Callable[[], Any] = contextlib.nullcontext
    logical_names: tuple[str, ...] = ()   # the logical axis names the parameters carry, sorted
    calls: calls_mod.CallLog | None = None   # filled when the step is traced: where --remat-at checkpointed
    schedule: pipeline_stages.Schedule | None = None   # the pipeline over the stage axis, its layers known
    constraints: dict | None = None   # filled when the step is traced: the model's own activation constraints
    captured: tuple = ()   # filled when the step is traced: its large constants (jaxmem.program.constants)
    lora_skipped: dict = dataclasses.field(default_factory=dict)   # --lora: modules left without an adapter, why
    trainable_source: str | None = None   # what chose the trainable leaves (None: a custom step's own state)
    changed: tuple[str, ...] = ()   # what jaxmem changed in the model's program, and the flag that undoes it
    # every logical name the parameters carry and the step's constraints use -> where (rules.logical_rules)
    names_used: dict[str, list[str]] = dataclasses.field(default_factory=dict)


# the arguments the step gives back updated: their buffers are donated (the frozen params are only read)
DONATED = ("trainable", "opt_state", "mutable", "rng")


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """A step checked and resolved before any device exists: :func:`build` only assembles it."""

    workload: Workload
    options: StepOptions
    mesh_spec: layouts.MeshSpec
    batch: Any          # the batch abstractly, --batch applied
    rules: rules_mod.RuleSet       # the layout's rules (the user's first) on this mesh
    rules_digest: str | None = None   # sha256 of the --rules file's content
    state_specs: list | None = None   # a custom step's own specs (Workload.state_specs), per state leaf
    batch_specs: list | None = None   # ... and per batch leaf (Workload.batch_specs)
    axis_types: str = "auto"          # the mesh's: --axis-types, or explicit when the workload asks for it
    schedule: pipeline_stages.Schedule | None = None   # a stage axis: the pipeline (its layer count found in build)
    notes: tuple[str, ...] = ()       # what plan chose for the user (the pipeline's microbatches)

    @property
    def explicit(self) -> bool:
        return self.axis_types == "explicit"


def plan(wl: Workload, opts: StepOptions, mesh_spec: layouts.MeshSpec) -> StepPlan:
    """Every check the options and the batch's shapes decide, once: the layout against the mesh,
    the fine-tuning choices, --batch, each batch leaf against the axes that split it, the sizes
    XLA can express, and --accum's microbatches."""
    user_specs.check_workload(wl)
    _pipeline_flags(wl, opts, mesh_spec)
    layouts.check_layout(opts.layout, mesh_spec, custom_step=wl.is_custom_step, own_specs=wl.state_specs is not None)
    if opts.precision not in PRECISIONS:
        raise UserError(f"unknown precision {opts.precision!r}. Known: {', '.join(PRECISIONS)}.")
    if opts.accum < 1:
        raise UserError("--accum must be at least 1")
    finetune.check(opts.finetune, custom_step=wl.is_custom_step, precision=opts.precision, donate=opts.donate)
    if wl.is_custom_step and (opts.precision != "fp32" or opts.optimizer or opts.accum != 1):
        raise UserError("--precision/--optimizer/--accum apply to steps jaxmem builds; this workload gives its own "
                        "`step`")
    state.check_moments(wl, opts)
    # the frozen base in the checkpoint's dtype where the user named none (stated in the report's choices)
    opts = dataclasses.replace(opts, finetune=finetune.resolve_base(opts.finetune, wl.checkpoint_dtype,
                                                                    opts.precision))
    batch = state.override_batch(wl.batch, opts.batch_size)
    flat, _ = jax.tree_util.tree_flatten_with_path(batch)
    batch_specs = None if wl.batch_specs is None else user_specs.resolve(batch, wl.batch_specs, mesh_spec, "batch")
    for path, x in flat if batch_specs is None else ():
        layouts.batch_spec(tuple(x.shape), mesh_spec, tree.path_str(path))
    sizes.check_leaves([sizes.Leaf(f"batch:{tree.path_str(p)}", "batch", tuple(x.shape), str(x.dtype),
                                   x.dtype.itemsize) for p, x in flat], x64=tree.x64())
    if opts.accum > 1 and flat:
        n = flat[0][1].shape[0]
        if n % opts.accum or (n // opts.accum) % max(mesh_spec.data_size, 1):
            raise UserError(f"--accum {opts.accum}: global batch {n} must split into {opts.accum} microbatches "
                            f"each divisible by the {mesh_spec.data_size} data-parallel devices")
    sizes.check_loop(opts.accum, f"--accum {opts.accum}: the gradient accumulation loop",
                     "use a smaller --accum (larger microbatches)")
    user, digest = rules_mod.load(opts.rules) if opts.rules else ((), None)
    rules = rules_mod.rule_set(opts.layout, mesh_spec, user, wl.axis_rules)
    state_specs = None
    if wl.state_specs is not None:
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), wl.state)
        state_specs = user_specs.resolve(abstract, wl.state_specs, mesh_spec, "state")
    axis_types = "explicit" if "explicit" in (opts.axis_types, wl.axis_types) else "auto"
    if axis_types == "explicit":
        rules = dataclasses.replace(rules, as_written=True)
    schedule, notes = _plan_pipeline(wl, opts, mesh_spec, flat[0][1].shape[0] if flat and flat[0][1].shape else None,
                                     axis_types)
    if schedule is not None:
        opts = dataclasses.replace(opts, microbatches=schedule.microbatches)
    return StepPlan(wl, opts, mesh_spec, batch, rules, digest, state_specs, batch_specs, axis_types, schedule,
                    tuple(notes))


def _pipeline_flags(wl: Workload, opts: StepOptions, mesh_spec: layouts.MeshSpec) -> None:
    """The pipeline's options only where jaxmem builds a pipeline (first: their message says more)."""
    stage = mesh_spec.axis_of("stage")
    n = mesh_spec.axis_size(stage) if stage else 1
    asked = [flag for flag, given in (("--pipeline", opts.pipeline != "gpipe"), ("--microbatches", opts.microbatches),
                                      ("--repeats", opts.repeats), ("--stage-remat", opts.stage_remat)) if given]
    if asked and (n == 1 or wl.is_custom_step):
        why = ("this workload gives its own step, which pipelines itself" if wl.is_custom_step and n > 1
               else "they need a stage axis in --mesh, e.g. --mesh stage=4,fsdp=2")
        raise UserError(f"{'/'.join(asked)}: {why}")


def _plan_pipeline(wl: Workload, opts: StepOptions, mesh_spec: layouts.MeshSpec, batch: int | None,
                   axis_types: str) -> tuple[pipeline_stages.Schedule | None, list[str]]:
    """The pipeline a stage axis asks for (None without one), checked before any device exists."""
    stage = mesh_spec.axis_of("stage")
    if stage is None or mesh_spec.axis_size(stage) == 1 or wl.is_custom_step:
        return None, []
    n = mesh_spec.axis_size(stage)
    if opts.precision == "fp8":
        raise UserError(f"--precision fp8 with --mesh {stage}={n}: FP8 scaling state is not pipelined yet; use "
                        "--precision bf16, or drop the stage axis")
    if axis_types == "explicit":
        raise UserError(f"--mesh {stage}={n} with explicit axes: jaxmem pipelines under auto axes only; use "
                        "--axis-types auto, or drop the stage axis")
    return pipeline_stages.resolve(opts.pipeline, n, opts.microbatches, opts.repeats, batch, mesh_spec.data_size,
                                   stage, opts.accum, stage_remat=opts.stage_remat)


def build(p: StepPlan, mesh) -> BuiltStep:
    """The planned step on `mesh`: abstract state, shardings, the function. Checks nothing."""
    wl, opts, mesh_spec, batch = p.workload, p.options, p.mesh_spec, p.batch
    if wl.is_custom_step:
        return _build_custom(p, mesh)

    # explicit-sharding code names mesh axes in its calls (out_sharding=P(...)): its init needs the mesh too;
    # an NNX model's first call (its init trace) runs under the mesh in context, as the step's trace
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if p.explicit else contextlib.nullcontext():
        st = state.abstract_state(wl, opts, batch, call_context=None if p.explicit else functools.partial(
            sharding.tracing, mesh, sharding.activation_rules(p.rules)),
            build_context=functools.partial(sharding.target_devices, mesh))
    schedule, stage_leaves = p.schedule, frozenset[str]()
    if schedule is not None:   # which parameters are the stacked layers (sharded over the stage axis)?
        probe = loss_function(wl, st, opts, mesh, mesh_spec, explicit=p.explicit, log=calls_mod.CallLog(wl.remat_at))
        try:
            with sharding.tracing(mesh, sharding.activation_rules(p.rules)):
                stage_leaves, layers = pipeline_stages.layer_leaves(probe, st, schedule)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 -- the model's trace: explained as compiled.lower explains it
            raise UserError(errors.trace_error(e, explicit=p.explicit)) from None
        schedule = pipeline_stages.with_layers(schedule, layers)
    sh = sharding.shard_state(st, p.rules, mesh, mesh_spec,
                              stage=None if schedule is None else (schedule.axis, stage_leaves))
    log = calls_mod.CallLog(wl.remat_at, unapplied=wl.remat_at_unapplied)
    fn = train_step(wl, st, sh, opts, mesh, mesh_spec, explicit=p.explicit, log=log, schedule=schedule)
    donate = tuple(i for i, name in enumerate(StepArgs._fields) if name in DONATED) if opts.donate else ()
    out_sh = StepOut(sh.shardings(sh.trainable), sh.shardings(sh.opt_state), sh.shardings(sh.mutable),
                     sh.shardings(sh.rng), NamedSharding(mesh, P()))
    notes = [] if opts.donate else ["state not donated (--no-donate)"]
    names = {n for spec in jax.tree.leaves(st.param_names, is_leaf=lambda x: isinstance(x, (P, tuple)))
             if isinstance(spec, (P, tuple)) for e in spec for n in ((e,) if isinstance(e, str) else e or ())}
    used = sharding.param_name_places(st)   # and, as the step is traced, the names its constraints use
    check = functools.partial(rules_mod.check_unmapped, used, sh.rules, mesh_spec, opts.unmapped)
    return BuiltStep(fn, sh.args, donate, sh.leaves, sh.issues, mesh, opts.donate, notes, out_sh,
                     trace_context=functools.partial(sharding.step_tracing, mesh, sharding.activation_rules(p.rules),
                                                     used, check), names_used=used,
                     logical_names=tuple(sorted(names)), calls=log, schedule=schedule,
                     trainable_source=st.trainable_source, lora_skipped=st.lora_skipped,
                     changed=changes(wl, opts))


def changes(wl: Workload, opts: StepOptions) -> tuple[str, ...]:
    """What jaxmem changed in the model's program (its code runs changed), each with the flag that undoes
    it: an error raised inside the user's code names them (compiled.lower), as the likely cause."""
    ft = opts.finetune
    out = []
    if opts.precision in ("bf16", "fp8"):
        out.append(f"--precision {opts.precision} cast the parameters and the batch's floats to bf16 for compute "
                   "(state created inside the model, such as a scan's carry, stays as the model makes it: "
                   "--precision fp32 runs the model as written)")
    elif opts.precision == "bf16-pure":
        out.append("--precision bf16-pure stores and computes every parameter in bf16 (--precision fp32 runs the "
                   "model as written)")
    if opts.precision == "fp8":
        out.append("--precision fp8 runs the dense/einsum matmuls through qwix's FP8 (--precision bf16 drops it)")
    if ft.lora_rank:
        out.append(f"--lora {ft.lora_rank} put qwix's LoRA adapters under the model's dense/einsum/conv calls "
                   "(drop --lora)")
    if ft.base_dtype is not None:
        base = "--base-dtype" if ft.base_dtype != "bf16" else "the frozen base"
        out.append(f"{base} {ft.base_dtype}: the frozen weights stored as {ft.base_dtype} (a checkpoint's bf16 "
                   "is kept: --base-dtype sets another)")
    if wl.remat_at is not None:
        out.append(f"--remat-at {wl.remat_at!r} wrapped the matching module calls in a checkpoint (drop --remat-at)")
    if opts.accum > 1:
        out.append(f"--accum {opts.accum} runs the loss on {opts.accum} microbatches in a scan (drop --accum)")
    return tuple(out)


def loss_function(wl: Workload, st: state.AbstractState, opts: StepOptions, mesh, mesh_spec, *,
                  explicit: bool = False, log: calls_mod.CallLog):
    """`loss_fn(trainable, frozen, mutable, batch, key) -> (loss, new mutable)`: the model's loss on one
    (micro)batch, in the compute precision, with jaxmem's activation constraints and --remat-at."""
    user_loss = wl.loss
    assert user_loss is not None   # a workload without its own step has a loss (Workload.validate)
    seq = layouts.seq_len([tuple(x.shape) for x in jax.tree.leaves(st.batch)])
    # Explicit axes: the code places its activations itself (out_sharding=), and a constraint is a reshard
    act_ctx = (lambda model: contextlib.nullcontext()) if explicit else functools.partial(
        sharding.activation_constraints, mesh, mesh_spec, opts.layout, st.micro_size, seq, st.kind == "nnx")
    at_policy = workload_mod.remat_policy(opts.remat) if wl.remat_at is not None else None

    def cast_compute(params):
        if opts.precision in ("bf16", "fp8"):
            return jax.tree.map(lambda x: x.astype(jnp.bfloat16) if tree.is_float(x.dtype) else x, params)
        return params

    def cast_batch(b):
        if opts.precision in ("bf16", "bf16-pure", "fp8"):
            return jax.tree.map(lambda x: x.astype(jnp.bfloat16) if tree.is_float(x.dtype) else x, b)
        return b

    if st.kind == "nnx":
        from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

        def loss_fn(trainable, frozen, mut, b, key):
            params = cast_compute(st.params(trainable, frozen))

            def once(b, mut):
                # copy=True: the state was made at the jit trace; grad traces deeper and NNX refuses
                # to mutate (RNG counters, BatchStats) variables across trace levels.
                model = nnx.merge(st.model, params, mut, copy=True)
                with act_ctx(model), calls_mod.nnx_calls(model, remat_at=wl.remat_at, policy=at_policy, log=log):
                    loss = user_loss(model, cast_batch(b))
                _, _, new_mut = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]  # three parts for two filters
                made = state.new_state_message(mut, new_mut)
                if made is not None:   # a raw pytree mismatch otherwise
                    raise UserError(made)
                return jnp.asarray(loss, jnp.float32), new_mut

            return calls_mod.with_collective_axis(once, b, mut, mesh_spec.data_size, mesh_spec.batch_axes, log)
    else:
        collections = list(st.mutable)
        # the FP8 scaling state rides through the model's scans as it did at init (fp8.scans_carry_state)
        fp8_scans = fp8.scans_carry_state if opts.precision == "fp8" else contextlib.nullcontext

        def loss_fn(trainable, frozen, mut, b, key):
            params = cast_compute(st.params(trainable, frozen))

            def once(b, mut):
                bound = st.model.bind({"params": params, **mut},
                                      rngs={c: jax.random.fold_in(key, i) for i, c in enumerate(wl.rng_collections)},
                                      mutable=collections)
                with act_ctx(None), calls_mod.linen_calls(wl.remat_at, at_policy, log), fp8_scans():
                    loss = user_loss(bound, cast_batch(b))
                _, new_vars = bound.unbind()
                new_mut = {c: new_vars[c] for c in collections if c in new_vars}
                return jnp.asarray(loss, jnp.float32), new_mut

            return calls_mod.with_collective_axis(once, b, mut, mesh_spec.data_size, mesh_spec.batch_axes, log)

    return loss_fn


def train_step(wl: Workload, st: state.AbstractState, sh: sharding.ShardedState, opts: StepOptions, mesh, mesh_spec,
               *, explicit: bool = False, log: calls_mod.CallLog | None = None,
               schedule: pipeline_stages.Schedule | None = None):
    """`step(*StepArgs) -> StepOut`: (trainable, frozen, opt_state, mutable, rng, batch) ->
    (trainable, opt_state, mutable, rng, loss).

    Only the trainable tree is differentiated and updated: frozen parameters get neither
    gradients nor optimizer state. With a `schedule`, the loss runs its layers as that pipeline.
    """
    tx = st.tx
    offload = st.opt_memory == "pinned_host"
    constrain = jax.sharding.reshard if explicit else jax.lax.with_sharding_constraint
    trainable_sh = sh.shardings(sh.trainable)
    log = calls_mod.CallLog(wl.remat_at) if log is None else log
    loss_fn = loss_function(wl, st, opts, mesh, mesh_spec, explicit=explicit, log=log)
    if schedule is not None:
        loss_fn = pipeline_stages.pipelined(loss_fn, schedule, mesh, mesh_spec.batch_axes)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)   # w.r.t. the trainable tree only
    # a microbatch is split as the batch is (dim 0 over the batch axes, the sequence over context)
    micro_spec = {id(x): layouts.batch_spec((x.shape[0] // opts.accum,) + tuple(x.shape[1:]), mesh_spec, "")
                  for x in jax.tree.leaves(sh.batch) if opts.accum > 1 and x.shape}

    def step(trainable, frozen, opt_state, mutable, rng_data, batch):
        key = jax.random.wrap_key_data(rng_data["rng"])
        if opts.accum == 1:
            (loss, mutable), grads = grad_fn(trainable, frozen, mutable, batch, key)
        else:
            micro = jax.tree.map(lambda x: x.reshape((opts.accum, x.shape[0] // opts.accum) + x.shape[1:]), batch)
            micro = jax.tree.map(
                lambda x, a: constrain(x, NamedSharding(mesh, P(None, *micro_spec[id(a)]))),
                micro, sh.batch)

            def body(carry, mb):
                g_acc, mut, loss_acc, i = carry
                (loss, mut), g = grad_fn(trainable, frozen, mut, mb, jax.random.fold_in(key, i))
                g_acc = jax.tree.map(jnp.add, g_acc, g)
                g_acc = constrain(g_acc, trainable_sh)
                return (g_acc, mut, loss_acc + loss, i + 1), None

            zeros = jax.tree.map(jnp.zeros_like, trainable)
            (grads, mutable, loss, _), _ = jax.lax.scan(body, (zeros, mutable, jnp.float32(0), 0), micro)
            grads = jax.tree.map(lambda g: g / opts.accum, grads)
            loss = loss / opts.accum
        # Gradients live where their params live: reduce-scatter under FSDP.
        grads = constrain(grads, trainable_sh)
        if offload:  # the state lives in pinned host memory between steps: in for the update, back out
            opt_state = finetune.to_device(opt_state)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        if offload:
            opt_state = finetune.to_host(opt_state)
        trainable = optax.apply_updates(trainable, updates)
        return StepOut(trainable, opt_state, mutable, {"rng": jax.random.key_data(jax.random.fold_in(key, 1))}, loss)

    return step


def _build_custom(p: StepPlan, mesh) -> BuiltStep:
    """The escape hatch: the user's own step(state, batch) and abstract state, sharded by the user's
    specs when given (checked in plan), else by the layout's rules (names unknown: the fallback)."""
    wl, opts, mesh_spec, batch, rules = p.workload, p.options, p.mesh_spec, p.batch, p.rules
    issues: list[layouts.ShardingIssue] = []
    leaves: list[LeafInfo] = []
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), wl.state)

    def category(ps: str) -> str:
        head = ps.split("/", 1)[0]
        if head in ("params", "param"):
            return "params"
        if head in ("opt_state", "optimizer_state", "opt"):
            return "optimizer_state"
        return "other_state"

    given_state, given_batch = iter(p.state_specs or ()), iter(p.batch_specs or ())
    if p.state_specs is not None:
        state_spec = lambda ps, x: next(given_state)  # noqa: E731  (flattened order, as plan resolved them)
    else:
        state_spec = lambda ps, x: rules_mod.leaf_spec(  # noqa: E731
            ps, tuple(x.shape), x.dtype.itemsize, None, rules, mesh_spec, issues)
    if p.batch_specs is not None:
        batch_spec = lambda ps, x: next(given_batch)  # noqa: E731
    else:
        batch_spec = lambda ps, x: layouts.batch_spec(tuple(x.shape), mesh_spec, ps)  # noqa: E731
    a_state = sharding.shard_tree(abstract, category, state_spec, mesh, mesh_spec, leaves)
    a_batch = sharding.shard_tree(batch, "batch", batch_spec, mesh, mesh_spec, leaves)

    own = wl.step
    assert own is not None   # the escape hatch: the workload gives its step
    # --remat-at / Workload(remat_at=): the linen modules the step calls, and the Equinox modules of
    # jaxmem.equinox_workload, checkpointed where the pattern finds them (calls.custom_calls); none found: exit 2
    remat_at = wl.remat_at
    log = calls_mod.CallLog(remat_at, custom=True) if remat_at is not None else None
    policy = workload_mod.remat_policy(opts.remat) if log is not None else None

    def step(state, batch):
        with contextlib.nullcontext() if log is None or remat_at is None else \
                calls_mod.custom_calls(remat_at, policy, log):
            out = own(state, batch)
        differs = tree.state_difference(state, out[0])
        if differs is not None:   # seen while the step is traced: before any compile
            raise UserError(f"Workload(step=...): step(state, batch) returned a new state that differs from the state "
                            f"it was given: {differs}. A training step's new state must match its state leaf for leaf "
                            "(structure, shape, dtype): the donated buffers are reused for it, and a step that "
                            "changes them could not (the peak would be wrong) nor run twice. Return the state as it "
                            "came in (e.g. cast back with .astype(old.dtype)).")
        return out

    donated = wl.donate and opts.donate
    notes = [] if donated else ["state not donated (Workload(donate=False) or --no-donate)"]
    # Traced as a model file's step is, as the user's run traces it: under the mesh (a bare PartitionSpec
    # constraint resolves to it, jax.devices() answers the target's) and the logical-axis rules, every name
    # its constraints use recorded, stated in the report and refused where no rule maps it
    used: dict[str, list[str]] = {}
    check = functools.partial(rules_mod.check_unmapped, used, rules, mesh_spec, opts.unmapped)
    return BuiltStep(step, (a_state, a_batch), (0,) if donated else (), leaves, issues, mesh, donated, notes,
                     None, trace_context=functools.partial(sharding.step_tracing, mesh,
                                                           sharding.activation_rules(rules), used, check),
                     names_used=used, calls=log, changed=changes(wl, opts))


def check_donation(built: BuiltStep, copied_bytes: int) -> list[ReportWarning]:
    """not_donated: a state the step copies instead of updating in place (one per note of build)."""
    return [ReportWarning("not_donated", f"{n}: params + optimizer state + mutable state are copied, not "
                          "updated in place; donate them (jax.jit(..., donate_argnums=0))", copied_bytes)
            for n in built.notes]
