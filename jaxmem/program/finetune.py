"""Fine-tuning: which parameters train, LoRA / QLoRA adapters (through qwix), the frozen
base's storage dtype, and optimizer state in pinned host memory.

* ``--freeze REGEX``: parameters whose path (as the report prints it, e.g.
  ``layers/attn/q_proj/kernel``) matches are frozen: the step differentiates the
  trainable tree only and the optimizer is built over it, so XLA never sees a
  frozen gradient or moment.
* ``--lora RANK``: qwix's ``LoraProvider`` wraps the model; every dense/einsum/conv
  weight whose *module* path matches ``--lora-targets`` gets ``<weight>_lora_a`` and
  ``<weight>_lora_b`` (applied to the activations: ``x @ A @ B``, cast to the layer's compute
  dtype). Only adapters train.
* ``--base-dtype``: the frozen base in bf16, or quantized by qwix (int8, int4, nf4;
  per-channel scales in the weight's dtype, qwix's default) and dequantized in the step.
* ``--offload optimizer``: optimizer state in pinned host memory, moved to the device
  for the update and back inside the step (docs/how-it-works.md, "Host offload").
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxmem.errors import UserError, clip
from jaxmem.program import patterns
from jaxmem.program.options import BASE_DTYPES, OFFLOADS, FineTune
from jaxmem.program.tree import is_float, path_str
from jaxmem.report import ReportWarning

QUANTIZED_OPS = ("dot_general", "einsum")   # the ops whose weights --base-dtype quantizes (not convs)
# qwix stores a quantized weight W as W/array/qvalue (the values) and W/array/scale
QUANT_SCALE = re.compile(r"/array/scale$")
# qwix names the adapters of weight W `W_lora_a` and `W_lora_b` (NNX paths end in the Variable's /value).
ADAPTER = re.compile(r"_lora_[ab](/value)?$")


def check(ft: FineTune, *, custom_step: bool = False, precision: str = "fp32", donate: bool = True) -> None:
    """Refuse impossible combinations before anything is traced."""
    if custom_step and ft.active:
        raise UserError("--freeze/--train-all/--lora/--base-dtype/--offload apply to steps jaxmem builds; this "
                        "workload gives its own `step`: freeze, adapt or offload inside it")
    for flag, rx in (("--freeze", ft.freeze), ("--lora-targets", ft.lora_targets)):
        if rx is not None:
            patterns.compile_pattern(rx, flag)   # linear-time matching (RE2); exit 2 naming the flag otherwise
    if ft.train_all and (ft.freeze or ft.lora_rank):
        raise UserError(f"--train-all trains every parameter; {'--freeze' if ft.freeze else '--lora'} chooses which "
                        "train: give one of them")
    if ft.lora_rank < 0:
        raise UserError(f"--lora {ft.lora_rank}: the rank must be positive (0 turns LoRA off)")
    if ft.lora_alpha is not None and not (isinstance(ft.lora_alpha, (int, float)) and math.isfinite(ft.lora_alpha)
                                          and ft.lora_alpha > 0):
        raise UserError(f"--lora-alpha {ft.lora_alpha}: the scale must be a positive, finite number "
                        "(default: the rank)")
    if not ft.lora_rank and (ft.lora_targets is not None or ft.lora_alpha is not None):
        raise UserError("--lora-targets/--lora-alpha need --lora RANK")
    if ft.base_dtype is not None and ft.base_dtype not in BASE_DTYPES:
        raise UserError(f"unknown --base-dtype {ft.base_dtype!r}. Known: {', '.join(BASE_DTYPES)}.")
    if ft.base_dtype is not None and not ft.lora_rank:
        raise UserError(f"--base-dtype {ft.base_dtype} stores the frozen base of a LoRA fine-tune; add --lora RANK "
                        "(a quantized weight cannot be trained)")
    if ft.lora_rank and precision == "fp8":
        raise UserError("--precision fp8 with --lora: both put qwix under the model's matmuls, and jaxmem does not "
                        "combine them yet; use --precision bf16 for the LoRA step")
    if ft.base_dtype == "bf16" and precision == "fp32":
        raise UserError("--base-dtype bf16 with --precision fp32: a bf16 base in an fp32 step mixes dtypes inside "
                        "the model (and would be upcast per layer); use --precision bf16 (or bf16-pure)")
    if ft.offload_optimizer and not donate:
        raise UserError("--offload optimizer needs the state donated (drop --no-donate): without a GPU, JAX cannot "
                        "declare an argument in host memory, and XLA places the optimizer state there only by "
                        "aliasing it to the step's host-resident output (docs/how-it-works.md, 'Host offload')")
    if ft.offload is not None and ft.offload not in OFFLOADS:
        if ft.offload == "activations":
            raise UserError("--offload activations is not supported: jaxmem places checkpoints through the model's "
                            "own remat policy; offload activations there (jax.checkpoint_policies.offload_dot_with_no_"
                            "batch_dims) and analyze that model. Known: --offload optimizer.")
        raise UserError(f"unknown --offload {ft.offload!r}. Known: {', '.join(OFFLOADS)}.")


def resolve_base(ft: FineTune, checkpoint_dtype: str | None, precision: str) -> FineTune:
    """--lora's frozen base without --base-dtype: the checkpoint's dtype (Workload.checkpoint_dtype, a
    config.json's torch_dtype) where the step computes in bf16 -- a bf16 or fp16 checkpoint is loaded as
    it is stored (2 bytes a weight), never upcast to fp32 for a base that is only read. Under --precision
    fp32 (a bf16 base would mix dtypes in the model) and for a model without a checkpoint dtype, the base
    stays in the dtype the model creates it in (jaxmem.analysis.choices states which)."""
    if not ft.lora_rank or ft.base_dtype is not None or precision not in ("bf16", "bf16-pure"):
        return ft
    if checkpoint_dtype in ("bfloat16", "float16"):   # fp16 is stored in bf16: the same bytes, the step's dtype
        return dataclasses.replace(ft, base_dtype="bf16")
    return ft


# ---------------------------------------------------------------- LoRA / QLoRA through qwix


def _qtype(base_dtype: str | None):
    return {"int8": jnp.int8, "int4": jnp.int4, "nf4": "nf4"}.get(base_dtype or "")


def provider(ft: FineTune):
    """qwix's (Q)LoRA provider: adapters on the targets; the base quantized everywhere qwix can."""
    import qwix  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8

    # --lora-targets is searched in the module path (like --freeze in the param path), by RE2: the
    # provider decides each path (patterns.lookup_rule) and qwix full-matches ".*" or nothing
    targets = ".*"
    qtype = _qtype(ft.base_dtype)
    alpha = float(ft.lora_alpha if ft.lora_alpha is not None else ft.lora_rank)
    if qtype is None:
        return _selecting(_LoraProvider([qwix.LoraRule(module_path=targets, rank=ft.lora_rank, alpha=alpha)]), ft, 1)
    # qwix 0.1.8 quantizes a conv's weight only together with its activations (PtqProvider.
    # conv_general_dilated raises otherwise), so conv weights keep their dtype; the first rule that
    # matches an op wins. QLoRA quantizes the whole base, not only the adapted weights.
    return _selecting(_LoraProvider([
        qwix.LoraRule(module_path=targets, op_names=QUANTIZED_OPS, rank=ft.lora_rank, alpha=alpha, weight_qtype=qtype),
        qwix.LoraRule(module_path=targets, rank=ft.lora_rank, alpha=alpha),
        qwix.QuantizationRule(module_path=".*", op_names=QUANTIZED_OPS, weight_qtype=qtype),
    ]), ft, 2)


def _selecting(provider, ft: FineTune, n_rules: int):
    """The provider with its first `n_rules` rules (the adapters') selecting the module paths
    --lora-targets finds (patterns.lookup_rule)."""
    if ft.lora_targets is not None:
        rx = patterns.compile_pattern(ft.lora_targets, "--lora-targets")
        provider.jaxmem_paths = dict.fromkeys(range(n_rules), lambda path: rx.search(path) is not None)
    return provider


def _provider_class():
    import qwix  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8
    from qwix._src.providers import lora as qwix_lora  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8
    from qwix._src.providers import ptq as qwix_ptq  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8
    from qwix._src.utils import flax_util  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8

    def lora_rule(provider, op: str, rhs):
        """The LoraRule of this op and the name of its weight, or None when it takes no adapter.

        Asked before the base op runs: under QLoRA the base op's first call (at init) replaces the
        weight with its quantized form, after which qwix's find_param no longer recognizes a weight
        that was reshaped on creation (DenseGeneral's kernel) and the adapter would go missing."""
        rule, _ = provider._get_current_rule_and_op_id(op, only_rule=True)
        if not isinstance(rule, qwix_lora.LoraRule):
            return None
        weight_name = flax_util.find_param(rhs, qwix_ptq.WithAux)
        if weight_name is None:   # rhs is not a weight
            return None
        return None if _skipped_here(provider, weight_name, flax_util) else (rule, weight_name)

    class LoraProvider(qwix.LoraProvider):
        """qwix's LoraProvider, with the adapter's contribution in the base op's output dtype.

        qwix 0.1.8 adds ``x @ A @ B`` (A, B in the weight's storage dtype, fp32 usually) to the base
        output as it is, so a layer computing in bf16 (``Dense(dtype=bf16)``) returns fp32: an
        ``nn.scan`` carry changes dtype (a TypeError), fp32 reaches ops that take bf16 only (cuDNN
        attention), and a bf16 conv fails (lax.conv takes one dtype). Like PEFT, the adapter
        computes in the promoted dtype and its output is cast to the base output's: the layer keeps
        its compute dtype. Also: the weight is looked up before the base op (``lora_rule``), and
        qwix's ``einsum`` debug string is not stored on the module (a frozen linen module refuses
        it: SetAttributeFrozenModuleError). Otherwise qwix's computation, from its own helpers; the
        rules jaxmem makes have no LoRA dropout, so none is applied.
        """

        def _get_current_rule_and_op_id(self, op_name, **kwargs):   # --lora-targets decided by RE2
            return patterns.lookup_rule(self, super()._get_current_rule_and_op_id, op_name, **kwargs)


        def dot_general(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                        out_sharding=None):
            if _in_embed(flax_util):   # a tied embedding's attend: the table stays unquantized, no adapter
                return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                           preferred_element_type=preferred_element_type, out_sharding=out_sharding)
            found = lora_rule(self, "dot_general", rhs)
            res = qwix_ptq.PtqProvider.dot_general(self, lhs, rhs, dimension_numbers, precision,
                                                   preferred_element_type, out_sharding=out_sharding)
            if found is None:
                return res
            rule, weight_name = found
            delta = _dot_general_delta(qwix_lora, rule, weight_name, lhs, rhs, dimension_numbers, precision)
            return res + delta.astype(res.dtype)

        def einsum(self, einsum_str, *operands, **kwargs):
            found = lora_rule(self, "einsum", operands[1]) if len(operands) == 2 else None
            res = qwix_ptq.PtqProvider.einsum(self, einsum_str, *operands, **kwargs)
            if found is None:
                return res
            rule, weight_name = found
            delta = _einsum_delta(qwix_lora, rule, weight_name, einsum_str, *operands, **kwargs)
            return res + delta.astype(res.dtype)

        def conv_general_dilated(self, lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                                 dimension_numbers=None, feature_group_count=1, batch_group_count=1, precision=None,
                                 preferred_element_type=None, out_sharding=None):
            conv = {"lhs_dilation": lhs_dilation, "rhs_dilation": rhs_dilation,
                    "feature_group_count": feature_group_count,
                        "batch_group_count": batch_group_count, "precision": precision,
                        "preferred_element_type": preferred_element_type}
            found = lora_rule(self, "conv_general_dilated", rhs)
            res = qwix_ptq.PtqProvider.conv_general_dilated(
                self, lhs, rhs, window_strides, padding, dimension_numbers=dimension_numbers,
                out_sharding=out_sharding, **conv)
            if found is None:
                return res
            rule, weight_name = found
            delta = _conv_delta(qwix_lora, rule, weight_name, lhs, rhs, window_strides, padding, dimension_numbers,
                                conv)
            return res + delta.astype(res.dtype)

    return LoraProvider


def _skipped_here(provider, weight_name: str, flax_util) -> bool:
    """The current linen module cannot hold an adapter: it runs under its own ``apply`` with a params
    dict the model built itself (Hugging Face's GPT-2 ties its head as ``lm_head.apply({"params":
    {"kernel": wte.T}}, h)``), whose scope takes no new parameter, and it has none from an init (qwix
    would raise ScopeParamNotFoundError). Such a weight is the model's own, not a trained layer's: it is
    left without an adapter, and the module named in `provider.jaxmem_skipped` (a lora_skipped warning);
    `flax_util` is qwix's (qwix._src.utils.flax_util)."""
    module = flax_util.get_current_module()
    scope = getattr(module, "scope", None) if isinstance(module, nn.Module) else None
    if scope is None or scope.is_mutable_collection("params") or module.has_variable("params", f"{weight_name}_lora_a"):
        return False
    name = "/".join(str(p) for p in module.path) or module.name or type(module).__name__
    provider.jaxmem_skipped.setdefault(
        name, f"{type(module).__name__} applied with a params dict the model builds itself "
              f"({name}.apply({{'params': ...}}): a tied head), which holds no parameter but the {weight_name!r} given")
    return True


def _in_embed(flax_util) -> bool:
    """The op runs inside an embedding module (linen or NNX Embed: ``attend`` of a tied head); `flax_util`
    is qwix's (qwix._src.utils.flax_util)."""
    from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

    return isinstance(flax_util.get_current_module(), (nn.Embed, nnx.Embed))


# The adapter's contribution (x @ A @ B) * alpha / rank to each op, from qwix's own helpers; `qwix_lora`
# is qwix._src.providers.lora, `rule` the op's LoraRule and `weight_name` its weight's.

def _dot_general_delta(qwix_lora, rule, weight_name: str, lhs, rhs, dimension_numbers, precision):
    (lhs_ca, rhs_ca), (lhs_ba, rhs_ba) = dimension_numbers
    rhs_ra = tuple(i for i in range(rhs.ndim) if i not in rhs_ca and i not in rhs_ba)
    contract, batch, remain = (tuple(rhs.shape[i] for i in axes) for axes in (rhs_ca, rhs_ba, rhs_ra))
    a_shape, a_t, b_shape, b_t = qwix_lora._create_lora_layer_shapes(
        rhs_ca, rhs_ba, rhs_ra, contract, batch, remain, rule.rank)
    lora_a, lora_b = qwix_lora._get_or_create_lora_params(
        name=weight_name, rule=rule, a_shape=a_shape, b_shape=b_shape,
        a_sharding_transpose=a_t, b_sharding_transpose=b_t)
    delta = qwix_lora._compute_lora_delta(lhs, lora_a, lora_b, lhs_ca, lhs_ba, contract, batch, remain,
                                          rule.rank, precision=precision)
    return delta * (rule.alpha / rule.rank)


def _einsum_delta(qwix_lora, rule, weight_name: str, einsum_str, lhs, rhs, **kwargs):
    a_shape, b_shape, lora_str, a_t, b_t = qwix_lora._parse_einsum_str_for_lora(
        lhs.shape, rhs.shape, einsum_str, rule.rank)
    lora_a, lora_b = qwix_lora._get_or_create_lora_params(
        name=weight_name, rule=rule, a_shape=a_shape, b_shape=b_shape,
        a_sharding_transpose=a_t, b_sharding_transpose=b_t)
    return jnp.einsum(lora_str, lhs, lora_a, lora_b, **kwargs) * (rule.alpha / rule.rank)


def _conv_delta(qwix_lora, rule, weight_name: str, lhs, rhs, window_strides, padding, dimension_numbers,
                conv: dict):
    dn = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    # qwix's adapter x * A @ B needs the output features last, in the kernel and the output
    if not (dn.rhs_spec[0] == rhs.ndim - 1 and dn.out_spec[1] == lhs.ndim - 1):
        raise NotImplementedError(f"LoRA on a conv with output features not last: {dn}")
    lora_a, lora_b = qwix_lora._get_or_create_lora_params(
        name=weight_name, rule=rule, a_shape=(*rhs.shape[:-1], rule.rank), b_shape=(rule.rank, rhs.shape[-1]),
        a_sharding_transpose=(*range(rhs.ndim - 1), None), b_sharding_transpose=(None, rhs.ndim - 1))
    # lax.conv takes one dtype (a bf16 layer's input, the fp32 adapter): the promoted one, as
    # dot_general promotes by itself
    dt = jnp.promote_types(lhs.dtype, lora_a.dtype)
    delta = jax.lax.conv_general_dilated(lhs.astype(dt), lora_a.astype(dt), window_strides, padding,
                                         dimension_numbers=dn, **conv)
    return delta @ lora_b * (rule.alpha / rule.rank)


def _LoraProvider(rules):  # noqa: N802 (a class made on first use: qwix is imported only for fine-tuning)
    provider = _provider_class()(rules)
    provider.jaxmem_skipped = {}   # module -> why it took no adapter (_skipped_here)
    return provider


def wrap_linen(model, ft: FineTune, skipped: dict[str, str] | None = None):
    """The linen model with qwix's adapters (and quantized base) intercepting its ops. `skipped`: filled,
    as the model is traced, with the modules that could take no adapter and why (_skipped_here)."""
    import qwix  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8

    p = provider(ft)
    if skipped is not None:
        p.jaxmem_skipped = skipped
    return qwix.apply_lora_to_model(model, p)


def check_lora_skipped(skipped: dict[str, str]) -> list[ReportWarning]:
    """lora_skipped: a module --lora targets that could take no adapter (wrap_linen's `skipped`)."""
    return [ReportWarning("lora_skipped", f"--lora: no adapter on {name}: {why}; its matmul uses that weight "
                          "as given, frozen with the rest of the base")
            for name, why in sorted(skipped.items())]


def wrap_nnx(make_model, ft: FineTune, loss, batch):
    """An NNX model with qwix's adapters, built abstractly.

    qwix initializes NNX adapters by calling the model once with its own inputs; jaxmem
    knows only ``loss(model, batch)``, so the inputs of that first call are captured from
    the loss and handed to ``qwix.apply_lora_to_model`` (all under ``nnx.eval_shape``).
    """
    import qwix  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8
    from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

    def build():
        model = make_model()
        args, kwargs = first_call(model, loss, batch, "--lora")
        if "rngs" not in kwargs:
            return qwix.apply_lora_to_model(model, provider(ft), *args, rngs=_shape_rngs(), **kwargs)
        # The model's call takes its own rngs= (the loss passes them, as Gemma's train step does), and qwix
        # takes the adapters' RNGs as that same keyword and calls the model without it: qwix sets the
        # adapters up without its first call, which is made here with the loss's own arguments (with what
        # qwix sets for its own first call, and unsets after it, set around this one).
        model = qwix.apply_lora_to_model(model, provider(ft), rngs=_shape_rngs(), skip_nnx_init=True)
        model.set_attributes(disable_quant_stats_update=True, qwix_rngs=_shape_rngs())
        model(*args, **kwargs)
        model.set_attributes(disable_quant_stats_update=False, qwix_rngs=None)
        return model

    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(build)


def _shape_rngs():
    """The RNGs qwix initializes adapters from, holding no state.

    qwix sets one ``nnx.Rngs`` on every module for its first call; an ``nnx.Rngs`` carries its key and
    counter as state, so a block stacked by ``nnx.vmap`` and run by ``nnx.scan`` would hand the scan
    a 0-d leaf to slice (``IndexError: tuple index out of range``). jaxmem builds the model under
    ``nnx.eval_shape``, where only shapes matter: these RNGs give a constant key and hold nothing, so
    each layer's adapters are created inside the scan and come out stacked like the layer's weights."""
    from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

    class ShapeRngs(nnx.Rngs):
        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(name)
            return lambda: jax.random.key(0)

        def __getitem__(self, name):
            return lambda: jax.random.key(0)

    return ShapeRngs()


def first_call(model, loss, batch, flag: str) -> tuple[tuple, dict]:
    """The arguments `loss(model, batch)` calls the NNX `model` with (on zeros of the batch's shapes),
    captured without running the model: qwix initializes what it adds by calling the model once."""

    class _Captured(Exception):
        pass

    cls = type(model)
    orig = cls.__call__
    seen: dict[str, Any] = {}

    def capture(self, *a, **k):
        if self is model:
            seen["args"], seen["kwargs"] = a, k
            raise _Captured
        return orig(self, *a, **k)

    cls.__call__ = capture
    try:
        loss(model, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), batch))
    except _Captured:
        pass
    finally:
        cls.__call__ = orig
    if "args" not in seen:
        raise UserError(f"{flag} on an NNX model: loss(model, batch) never calls model(...), so qwix cannot "
                        "initialize what it adds (it runs the model's __call__ once)")
    return seen["args"], seen["kwargs"]


# ---------------------------------------------------------------- trainable / frozen

# What decided the trainable set (the report's `trainable.source`)
OWN_LORA = "nnx.LoRAParam"      # the model's own adapters: what tunix's PeftTrainer differentiates
EVERY = "every parameter"


def trainable_set(params, ft: FineTune, own=None) -> tuple[Any, Any, str]:
    """(trainable, frozen, source): the parameters the step trains, those it keeps frozen (trees of
    `params`' structure, None where the other holds the leaf; frozen is {} when nothing is) and what
    chose them.

    --lora and --freeze choose as the user wrote them. Otherwise a model that marks its own trainable
    leaves (`own`: a bool tree of `params`' structure, True at nnx.LoRAParam leaves, the adapters a user
    put on with qwix.apply_lora_to_model) trains those only, as tunix's PeftTrainer does
    (nnx.DiffState(0, nnx.LoRAParam)): the base gets no gradient and no optimizer state. --train-all
    trains every parameter regardless."""
    if ft.freeze or ft.lora_rank:
        trainable, frozen = split(params, ft)
        return trainable, frozen, " ".join(f for f, on in (("--lora", ft.lora_rank), ("--freeze", ft.freeze)) if on)
    if ft.train_all:
        return params, {}, "--train-all"
    if own is not None and any(jax.tree.leaves(own)):
        trains = jax.tree.map(lambda m, x: bool(m) and is_float(x.dtype), own, params)
        trainable = jax.tree.map(lambda m, x: x if m else None, trains, params)
        frozen = jax.tree.map(lambda m, x: None if m else x, trains, params)
        return trainable, frozen, OWN_LORA
    return params, {}, EVERY


def trainable_report(leaves, source: str | None) -> dict[str, Any]:
    """The report's `trainable`: how many parameter leaves and parameters train (get gradients and
    optimizer state), and what chose them; {} for a custom step's state (jaxmem cannot tell)."""
    if not source:
        return {}
    train = [leaf for leaf in leaves if leaf.category == "params" and leaf.trainable and "float" in leaf.dtype]
    return {"leaves": len(train), "parameters": sum(leaf.size for leaf in train), "source": source}


def split(params, ft: FineTune):
    """(trainable, frozen): two trees of `params`' structure, None where the other holds the leaf.

    Under LoRA only the adapters train; --freeze then freezes adapters too. Integer
    leaves (quantized weights) are never trainable.
    """

    freeze = patterns.compile_pattern(ft.freeze, "--freeze") if ft.freeze else None

    def trains(path, x) -> bool:
        ps = path_str(path)
        if not is_float(x.dtype):
            return False
        if ft.lora_rank and not ADAPTER.search(ps):
            return False
        return not (freeze and freeze.search(ps))

    mask = jax.tree_util.tree_map_with_path(trains, params)
    trainable = jax.tree.map(lambda m, x: x if m else None, mask, params)
    frozen = jax.tree.map(lambda m, x: None if m else x, mask, params)
    n_train = len(jax.tree.leaves(trainable))
    if ft.lora_rank and not any(ADAPTER.search(path_str(p))
                                for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]):
        where = f" (--lora-targets {clip(repr(ft.lora_targets))}, searched in module paths like 'layers/attn/q_proj')" \
            if ft.lora_targets else ""
        raise UserError(f"--lora {ft.lora_rank}: no dense/einsum/conv weight took an adapter{where}")
    if ft.freeze and not len(jax.tree.leaves(frozen)):
        raise UserError(f"--freeze {clip(repr(ft.freeze))} matches no parameter path (paths look like "
                        f"{_example_path(params)!r})")
    if n_train == 0:
        raise UserError(f"--freeze {clip(repr(ft.freeze))} freezes every parameter: nothing left to train")
    return trainable, frozen


def store_base(frozen, ft: FineTune, precision: str):
    """The frozen base's storage under --base-dtype: bf16 for every frozen float leaf qwix did not
    quantize (embeddings, norms; all of it for --base-dtype bf16) when the step computes in bf16.
    Under --precision fp32 those stay fp32: a bf16 leaf would mix dtypes in an fp32 model."""
    if ft.base_dtype is None or precision == "fp32":
        return frozen

    def one(path, x):
        if x is None or not is_float(x.dtype) or _is_qwix_scale(path):
            return x
        return jax.ShapeDtypeStruct(x.shape, jnp.bfloat16)

    return jax.tree_util.tree_map_with_path(one, frozen, is_leaf=lambda x: x is None)


def _is_qwix_scale(path) -> bool:
    # qwix stores a quantized weight as WithAux(array=QArray(qvalue, scale, ...)): its scales keep their dtype

    return bool(QUANT_SCALE.search(path_str(path)))


def _example_path(params) -> str:
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return path_str(flat[0][0]) if flat else ""


# ---------------------------------------------------------------- host offload


def to_device(tree):
    """Inside the step: host-resident state onto the device for the update."""
    return jax.device_put(tree, jax.memory.Space.Device)


def to_host(tree):
    """Inside the step: the updated state back to pinned host memory."""
    return jax.device_put(tree, jax.memory.Space.Host)
