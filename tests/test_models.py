"""The model files keep the jaxmem.Workload contract, end to end.

For each file's ``tiny`` preset, a real training step (init through the loss, grad,
optax update) runs on CPU with random arrays, exactly the way jaxmem builds its
step. The large presets are checked abstractly only: their parameter counts come
from ``jax.eval_shape`` / ``nnx.eval_shape``, nothing is allocated.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.core import meta

import jaxmem
from jaxmem.errors import UserError
from conftest import build_step
from jaxmem.program.workload import load_workload

MODELS = Path(__file__).resolve().parents[1] / "models"
LINEN = ["mlp", "resnet", "gpt2", "llama", "moe"]
NNX = ["vit", "mlp_nnx"]
WITH_REMAT = LINEN + NNX  # every file checkpoints its layers when asked
NO_HOOK = ["llama_nnx"]   # written as outside code is: no remat argument (jaxmem's --remat-at places checkpoints)

# Published parameter counts, to about 0.1%.
EXPECTED_PARAMS = {
    ("resnet", "resnet18"): 11.69e6,
    ("resnet", "resnet50"): 25.56e6,
    ("gpt2", "gpt2"): 124.44e6,
    ("gpt2", "gpt2-xl"): 1557.6e6,
    ("llama", "1b"): 1.2358e9,
    ("llama", "8b"): 8.030e9,
    ("llama", "70b"): 70.554e9,
    ("llama_nnx", "1b"): 1.2358e9,   # the same Llama 3.2 1B and Llama 3 8B, written in NNX
    ("llama_nnx", "8b"): 8.030e9,
    ("vit", "vit-b16"): 86.57e6,
    ("vit", "vit-l16"): 304.33e6,
}


def load(name: str, **model_args):
    """models/<name>.py's workload(**model_args), through jaxmem's own loader."""
    return load_workload(MODELS / f"{name}.py", **model_args)


def random_batch(spec, seed: int = 0):
    rng = np.random.default_rng(seed)

    def make(s):
        if jnp.issubdtype(s.dtype, jnp.integer):
            return jnp.asarray(rng.integers(0, 10, s.shape), s.dtype)  # valid labels / token ids in every tiny preset
        return jnp.asarray(rng.standard_normal(s.shape), s.dtype)

    return jax.tree.map(make, spec)


def n_params_abstract(wl) -> int:
    """Parameter count of a workload's model without allocating a single parameter."""
    if _is_nnx(wl):
        with nnx.use_eager_sharding(False):
            model = nnx.eval_shape(lambda: wl.model(nnx.Rngs(0)))
        return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    key = jax.random.key(0)

    def init(batch):
        return wl.model.init({"params": key, "dropout": key}, batch, method=lambda m, b: wl.loss(m, b))

    variables = jax.eval_shape(init, wl.batch)
    return sum(x.size for x in jax.tree.leaves(meta.unbox(variables["params"])))


def _is_nnx(wl) -> bool:
    return callable(wl.model) and not hasattr(wl.model, "init")


def _is_abstract(tree) -> bool:
    return all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


# -- a real training step, built the way jaxmem builds it ----------------------------
#
# Each builder returns one function of the batch that initializes the model (linen:
# through the loss, with rngs {"params", "dropout"}; NNX: by calling the model
# function), then takes one optimizer step. Under one jit that is one compile per case,
# which keeps the suite fast on a small CPU.


def linen_program(wl):
    key = jax.random.key(0)
    tx = wl.optimizer or optax.adamw(1e-3)

    def program(batch):
        variables = wl.model.init({"params": key, "dropout": key}, batch, method=lambda m, b: wl.loss(m, b))
        params = variables["params"]
        extra = {c: v for c, v in variables.items() if c != "params"}  # batch_stats, ...

        def loss_of(params):
            bound = wl.model.bind({"params": params, **extra}, rngs={"dropout": key}, mutable=list(extra))
            loss = wl.loss(bound, batch)
            _, new_vars = bound.unbind()
            return loss, {c: new_vars[c] for c in extra}

        (loss, new_extra), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, _ = tx.update(grads, tx.init(params), params)
        return (params, extra), (optax.apply_updates(params, updates), new_extra), loss

    return program


def nnx_program(wl):
    tx = wl.optimizer or optax.adamw(1e-3)

    def program(batch):
        model = wl.model(nnx.Rngs(0))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)  # rest: BatchStat, rng keys and counts

        def loss_of(params):
            # copy=True: the loss mutates Variables (rng counts, BatchStat) under grad's trace;
            # merging the outer trace's Variables instead raises TraceContextError.
            m = nnx.merge(graphdef, params, rest, copy=True)
            loss = wl.loss(m, batch)
            _, _, new_rest = nnx.split(m, nnx.Param, ...)
            return loss, new_rest

        (loss, new_rest), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, _ = tx.update(grads, tx.init(params), params)
        return (params, rest), (optax.apply_updates(params, updates), new_rest), loss

    return program


@functools.cache  # several tests look at the same step: compile it once
def run_tiny_step(name: str, remat: str):
    """One training step of the tiny preset on random data.

    Returns (loss, (params, extra state) before, the same after, compiled HLO text).
    """
    wl = load(name, preset="tiny", remat=remat)
    assert isinstance(wl, jaxmem.Workload)
    assert _is_abstract(wl.batch), "the batch must be ShapeDtypeStructs, never arrays"
    program = (nnx_program if _is_nnx(wl) else linen_program)(wl)
    batch = random_batch(wl.batch)
    # Backend optimization level 0 halves CPU compile time; the program is the same.
    compiled = jax.jit(program).lower(batch).compile(compiler_options={"xla_backend_optimization_level": 0})
    before, after, loss = compiled(batch)
    return float(loss), before, after, compiled.as_text()


def _changed(old, new) -> bool:
    def differ(a, b):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        return bool(jnp.any(a != b))

    return any(jax.tree.leaves(jax.tree.map(differ, old, new)))


# -- tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LINEN + NNX)
@pytest.mark.parametrize("remat", ["none", "full"])
def test_every_file_loads_through_jaxmem(name, remat):
    """Without arguments, the default (realistic) preset: abstract batch, a loss, a name."""
    wl = load(name, remat=remat)
    assert _is_abstract(wl.batch)
    assert wl.loss is not None and wl.optimizer is not None and wl.name


@pytest.mark.parametrize("name", LINEN + NNX + NO_HOOK)
def test_tiny_training_step_runs(name):
    loss, (params, extra), (new_params, new_extra), hlo = run_tiny_step(name, remat="none")
    assert np.isfinite(loss), f"{name}: loss {loss}"
    assert _changed(params, new_params), f"{name}: the optimizer did not move the parameters"
    if name in ("resnet", "mlp_nnx"):  # BatchNorm statistics (and rng counts) are train state too
        assert jax.tree.leaves(extra) and _changed(extra, new_extra), f"{name}: mutable state was not updated"
    assert "op_name=" in hlo


@pytest.mark.parametrize("name", WITH_REMAT)
def test_tiny_training_step_with_remat(name):
    loss, *_ = run_tiny_step(name, remat="full")
    assert np.isfinite(loss)


def test_remat_changes_the_program():
    """nn.remat / nnx.remat are really applied: the backward pass recomputes the forward."""
    *_, hlo = run_tiny_step("llama", remat="full")
    assert "rematted_computation" in hlo


def test_op_names_carry_module_paths():
    """Buffer attribution needs module paths in HLO metadata (flax_profile for linen, named_scope for NNX)."""
    *_, gpt2_hlo = run_tiny_step("gpt2", remat="none")
    assert re.search(r'op_name="jit\(program\)/[^"]*jvp\(GPT\)/block_1/attn/', gpt2_hlo)
    *_, llama_hlo = run_tiny_step("llama", remat="none")
    assert re.search(r'op_name="[^"]*while/body/[^"]*layers/mlp/', llama_hlo)  # the nn.scan body
    *_, vit_hlo = run_tiny_step("vit", remat="none")
    assert re.search(r'op_name="jit\(program\)/[^"]*jvp\(ViT\)/block_1/mlp/', vit_hlo)


@pytest.mark.parametrize("name", LINEN + NNX)
def test_unknown_preset_names_the_known_ones(name):
    with pytest.raises(UserError, match="known presets: .*tiny"):
        load(name, preset="no-such-model")
    with pytest.raises(UserError, match="no_such_field"):
        load(name, preset="tiny", no_such_field=1)
    with pytest.raises(UserError, match="remat"):
        load(name, preset="tiny", remat="sometimes")


@pytest.mark.parametrize(("name", "preset"), sorted(EXPECTED_PARAMS))
def test_parameter_counts_abstractly(name, preset):
    n = n_params_abstract(load(name, preset=preset))
    assert n == pytest.approx(EXPECTED_PARAMS[name, preset], rel=2e-3)


def test_llama_8b_and_70b_sizes():
    assert n_params_abstract(load("llama", preset="8b")) == pytest.approx(8.0e9, rel=0.02)
    assert n_params_abstract(load("llama", preset="70b", remat="full")) == pytest.approx(70.5e9, rel=0.02)


def test_llama_parameters_carry_logical_axes():
    wl = load("llama", preset="tiny")
    key = jax.random.key(0)
    variables = jax.eval_shape(lambda b: wl.model.init({"params": key}, b, method=lambda m, bb: wl.loss(m, bb)), wl.batch)
    boxes = jax.tree.leaves(variables["params"], is_leaf=lambda x: isinstance(x, meta.Partitioned))
    assert boxes and all(isinstance(b, meta.Partitioned) for b in boxes), "every parameter needs logical names"
    names = {n for b in boxes for n in b.names}
    assert {"embed", "mlp", "heads", "kv_heads", "head_dim", "vocab", "layers"} <= names
    q = variables["params"]["layers"]["attn"]["q_proj"]["kernel"]
    assert q.names == ("layers", "embed", "heads", "head_dim") and q.value.shape == (2, 64, 4, 16)


def test_sizes_follow_arguments():
    wl = load("gpt2", preset="tiny", batch_size=3, seq_len=16)
    assert wl.batch["tokens"].shape == (3, 16)
    with pytest.raises(UserError, match="block_size"):
        load("gpt2", preset="tiny", seq_len=10_000)
    wl = load("resnet", preset="tiny", batch_size=2, image_size=64)
    assert wl.batch["image"].shape == (2, 64, 64, 3)
    assert n_params_abstract(load("llama", preset="tiny", n_layers=3)) > n_params_abstract(load("llama", preset="tiny"))


# -- attention kernels and numerics (llama, gpt2) -----------------------------------------


def _h100_program(name: str, precision: str, **model_args) -> str:
    """The optimized HLO of the tiny preset's jaxmem step, compiled for one deviceless H100."""
    from jaxmem.compiler import compiled

    _, built = build_step(MODELS / f"{name}.py", gpu="h100", mesh="data=1", layout="dp", precision=precision,
                          model_args={"preset": "tiny", **model_args})
    exe, _ = compiled.lower_and_compile(built)
    return exe.as_text()


def _dot_kinds(hlo: str) -> set[str]:
    from jaxmem.compiler import steptime
    from jaxmem.xla import hlo_text

    return {kind for kind, _, _ in steptime.dot_flops(hlo_text.parse_module(hlo))}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_default_attention_is_xla_in_fp32(name):
    """Without arguments: attention written out in jnp (no cuDNN call), every dot on fp32 operands."""
    cfg = load(name, preset="tiny").model.config
    assert cfg.attention == "xla"
    *_, hlo = run_tiny_step(name, remat="none")
    assert "__cudnn$fmha" not in hlo
    assert _dot_kinds(hlo) == {"tf32"}   # fp32 operands (at JAX's default precision)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_cudnn_attention_compiles_to_cudnn_fused_attention_on_a_deviceless_h100(name):
    hlo = _h100_program(name, "bf16", attention="cudnn")
    targets = set(re.findall(r'custom_call_target="(__cudnn\$fmha\w*)"', hlo))
    assert any("Backward" in t for t in targets) and any("Backward" not in t for t in targets), targets
    assert "bkgts" not in hlo and "bhts" not in hlo   # the written-out score einsums are gone


@pytest.mark.parametrize("name", ["llama", "gpt2", "moe"])
def test_cudnn_attention_with_fp32_compute_is_refused_with_the_fix(name):
    with pytest.raises(UserError, match=rf"{name}: attention=cudnn needs bf16 or fp16 compute.*float32.*--precision bf16"):
        _h100_program(name, "fp32", attention="cudnn")


def test_llama_maxtext_numerics_keeps_fp32_weights_and_runs_its_dots_in_bf16():
    wl = load("llama", preset="tiny", numerics="maxtext")
    key = jax.random.key(0)
    variables = jax.eval_shape(lambda b: wl.model.init({"params": key}, b, method=lambda m, bb: wl.loss(m, bb)),
                               wl.batch)
    assert {x.dtype for x in jax.tree.leaves(meta.unbox(variables["params"]))} == {jnp.dtype("float32")}
    # at the default --precision fp32: every dot of the compiled step (forward, backward, attention) in bf16
    assert _dot_kinds(_h100_program("llama", "fp32", numerics="maxtext")) == {"bf16"}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_unknown_attention_or_numerics_names_the_choices(name):
    with pytest.raises(UserError, match=rf"{name}: attention='flash'; expected 'xla' or 'cudnn'"):
        load(name, preset="tiny", attention="flash")
    if name == "llama":
        with pytest.raises(UserError, match=r"llama: numerics='bf16'; expected one of 'default', 'maxtext'"):
            load(name, preset="tiny", numerics="bf16")


def test_llama_remat_save_keeps_the_named_activations():
    """remat_save (MaxText's checkpoint names) saves more than --remat full alone, less than no remat;
    names it does not know, or without a remat policy, are the user's error."""
    from jaxmem.pipeline import AnalyzeOptions, analyze_file

    def temp(remat, **args):
        opts = AnalyzeOptions(gpu="cpu", mesh="data=1", layout="dp", remat=remat, explain=False, cache=False,
                              model_args=tuple({"preset": "tiny", "seq_len": 256, **args}.items()))
        return analyze_file(str(MODELS / "llama.py"), opts).xla["temp"]

    full, saved, none = temp("full"), temp("full", remat_save="query_proj,key_proj,value_proj,mlpwo"), temp("none")
    assert full < saved < none
    with pytest.raises(UserError, match="known: query_proj"):
        load("llama", preset="tiny", remat="full", remat_save="qkv")
    with pytest.raises(UserError, match="give --remat"):
        load("llama", preset="tiny", remat="none", remat_save="mlpwo")


# -- long-context llama, MoE (moe.py) ----------------------------------------------------


def test_llama_8b_32k_is_the_8b_at_32k_tokens_with_cudnn_attention():
    import dataclasses

    wl = load("llama", preset="8b-32k")
    assert wl.batch["tokens"].shape == (8, 32768)
    # each load imports the file afresh (another Config class): compare the fields
    assert dataclasses.asdict(wl.model.config) == dict(dataclasses.asdict(load("llama", preset="8b").model.config),
                                                       seq_len=32768, attention="cudnn")


def _moe_params(**model_args):
    """The moe file's abstract params (boxed with their logical names) and the file's module."""
    wl = load("moe", **model_args)
    key = jax.random.key(0)
    variables = jax.eval_shape(lambda b: wl.model.init({"params": key}, b, method=lambda m, bb: wl.loss(m, bb)),
                               wl.batch)
    return variables["params"], sys.modules[type(wl.model).__module__]


@pytest.mark.parametrize(("gpu", "mesh"), [("h100", "data=2"), ("cpu", "data=1")])
def test_moe_tiny_analyzes(gpu, mesh):
    from click.testing import CliRunner

    from jaxmem import cli

    args = ["analyze", str(MODELS / "moe.py"), "--arg", "preset=tiny", "--gpu", gpu, "--mesh", mesh, "--json",
            "--no-explain"]
    r = CliRunner().invoke(cli.main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["model"] == "moe-tiny" and d["target"]["gpu"] == gpu and d["mesh"] == {"data": int(mesh[5:])}
    assert d["fits"] is (True if gpu == "h100" else None)  # the host has no fixed device memory to fit in
    n = n_params_abstract(load("moe", preset="tiny"))
    assert d["param_count"] == n
    assert d["breakdown"]["params"] == 4 * n // int(mesh[5:])  # fp32, every leaf (experts too) split over the data axis


@pytest.mark.parametrize("train_experts", [1, 0])
def test_a_ragged_dot_expert_layer_analyzes_with_exact_state_bytes(train_experts):
    """jax.lax.ragged_dot, the call the gemma library's Gemma 4 MoE is made of (MoERagged), in a layer
    written with its own bf16 params (benchmarks/outside/ragged_dot_layer.py, at a tiny size)."""
    from click.testing import CliRunner

    from jaxmem import cli

    experts, width, expert_width, tokens = 8, 64, 128, 512
    layer = MODELS.parent / "benchmarks" / "outside" / "ragged_dot_layer.py"
    args = ["analyze", str(layer), "--arg", f"tokens={tokens}", "--arg", f"experts={experts}", "--arg",
            f"width={width}", "--arg", f"expert_width={expert_width}", "--arg", f"train_experts={train_experts}",
            "--gpu", "h100", "--json", "--no-explain"]
    r = CliRunner().invoke(cli.main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    n = experts * width * expert_width + expert_width
    assert d["param_count"] == n
    assert d["breakdown"]["params"] == 2 * n                 # bf16, as the layer declares them
    assert d["breakdown"]["optimizer_state"] == 4 * n + 4    # adamw: mu and nu in the params' bf16, an int32 count
    assert d["breakdown"]["batch"] == tokens * width * 2 + experts * 4


def test_moe_expert_kernels_carry_the_exp_logical_name_first():
    params, _ = _moe_params(preset="tiny")
    boxes = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, meta.Partitioned))
    assert boxes and all(isinstance(b, meta.Partitioned) for b in boxes), "every parameter needs logical names"
    moe = params["layers"]["moe"]
    # (layers, ...) is nn.scan's stacking; each layer's kernel is (n_experts=4, ...)
    assert moe["gate_proj"]["kernel"].names == ("layers", "exp", "embed", "mlp")
    assert moe["up_proj"]["kernel"].names == ("layers", "exp", "embed", "mlp")
    assert moe["down_proj"]["kernel"].names == ("layers", "exp", "mlp", "embed")
    assert moe["gate_proj"]["kernel"].value.shape == (2, 4, 64, 128)
    assert moe["down_proj"]["kernel"].value.shape == (2, 4, 128, 64)
    assert moe["router"]["kernel"].names == ("layers", "embed", None)
    # what jaxmem reads (jaxmem/program/state.py): nn.get_partition_spec of the boxed tree
    import flax.linen as nn

    spec = nn.get_partition_spec(params)["layers"]["moe"]["gate_proj"]["kernel"]
    assert tuple(spec) == ("layers", "exp", "embed", "mlp")


# Mistral AI's announcements: "Mixtral of experts" (mistral.ai/news/mixtral-of-experts, Dec 2023): 46.7B total
# parameters, 12.9B used per token; "Cheaper, Better, Faster, Stronger" (mistral.ai/news/mixtral-8x22b, Apr
# 2024): 39B active out of 141B. Asserted to the rounding of the published figure (half its last digit).
MIXTRAL_PARAMS = {
    "mixtral-8x7b": (46.7e9, 12.9e9, 0.05e9),
    "mixtral-8x22b": (141e9, 39e9, 0.5e9),
}


@pytest.mark.parametrize("preset", sorted(MIXTRAL_PARAMS))
def test_mixtral_total_and_active_parameters_match_the_published_counts(preset):
    total, active, half_digit = MIXTRAL_PARAMS[preset]
    params, _ = _moe_params(preset=preset)
    params = meta.unbox(params)
    n = sum(x.size for x in jax.tree.leaves(params))
    experts = sum(params["layers"]["moe"][k]["kernel"].size for k in ("gate_proj", "up_proj", "down_proj"))
    assert abs(n - total) <= half_digit, n
    assert abs(n - experts * (8 - 2) / 8 - active) <= half_digit  # top-2 of 8: a token uses 2/8 of the experts


def _reference_route(top_idx, gates, n_experts, capacity):
    """Dispatch and combine by a loop: every token's first choice before any second choice, each
    expert filled in token order up to capacity."""
    g, s, k = top_idx.shape
    dispatch = np.zeros((g, s, n_experts, capacity), np.float32)
    combine = np.zeros_like(dispatch)
    for gi in range(g):
        filled = [0] * n_experts
        for ki in range(k):
            for si in range(s):
                e = top_idx[gi, si, ki]
                if filled[e] < capacity:
                    dispatch[gi, si, e, filled[e]] = 1
                    combine[gi, si, e, filled[e]] = gates[gi, si, ki]
                filled[e] += 1
    return dispatch, combine


def test_moe_routing_places_first_choices_first_and_drops_beyond_capacity():
    import dataclasses

    _, moe = _moe_params(preset="tiny")
    logits = jax.random.normal(jax.random.key(1), (3, 16, 4))  # 3 groups of 16 tokens, 4 experts
    capacity = 5  # 32 choices into 4 x 5 slots: some must be dropped
    dispatch, combine, aux = moe.route(logits, 2, capacity, jnp.float32)
    top_logits, top_idx = jax.lax.top_k(logits, 2)
    want_dispatch, want_combine = _reference_route(np.asarray(top_idx), np.asarray(jax.nn.softmax(top_logits)), 4,
                                                   capacity)
    np.testing.assert_array_equal(np.asarray(dispatch), want_dispatch)
    np.testing.assert_array_equal(np.asarray(combine), want_combine)
    assert 0 < want_dispatch.sum() < 3 * 16 * 2  # the case drops some choices and keeps others
    # Switch's loss: n_experts * sum_e (share of assignments to e) * (mean router probability of e)
    share = np.asarray(jax.nn.one_hot(top_idx, 4)).mean(axis=(0, 1, 2))
    prob = np.asarray(jax.nn.softmax(logits)).mean(axis=(0, 1))
    assert float(aux) == pytest.approx(4 * np.sum(share * prob), rel=1e-6)  # fp32 sums in another order
    # capacity = ceil(group_size * top_k * capacity_factor / n_experts), at most the group
    cfg = load("moe", preset="mixtral-8x7b").model.config
    assert moe.expert_capacity(cfg, 4096) == 1280
    assert moe.expert_capacity(cfg, 16) == 5  # ceil(5.0): no rounding up of an exact quotient
    assert moe.expert_capacity(dataclasses.replace(cfg, capacity_factor=8.0), 2) == 2  # 4, capped at the group


def test_moe_loss_is_cross_entropy_plus_the_weighted_aux_loss():
    wl = load("moe", preset="tiny")
    batch = random_batch(wl.batch)
    cfg = wl.model.config
    assert cfg.aux_loss_coef == 0.01

    class Model:  # the loss's view of the model: a call giving (logits, aux), and its config
        config = cfg

        def __call__(self, tokens, train):
            return jnp.asarray(np.random.default_rng(0).standard_normal((4, 32, 256)), jnp.float32), jnp.float32(1.25)

    logits, aux = Model()(batch["tokens"], True)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
    assert wl.loss(Model(), batch) == ce + 0.01 * aux

    # The real model's aux loss: positive, and a function of the router (so the loss trains it).
    def aux_and_grad(tokens):
        params = wl.model.init({"params": jax.random.key(0)}, tokens)["params"]
        return jax.value_and_grad(lambda p: wl.model.apply({"params": p}, tokens)[1])(params)

    fast = {"xla_backend_optimization_level": 0}  # as run_tiny_step: half the CPU compile, the same program
    aux, grads = jax.jit(aux_and_grad).lower(batch["tokens"]).compile(compiler_options=fast)(batch["tokens"])
    assert aux > 0
    assert np.any(np.asarray(meta.unbox(grads)["layers"]["moe"]["router"]["kernel"]) != 0)


def test_moe_arguments_are_checked():
    with pytest.raises(UserError, match="moe: seq_len=32 is not a multiple of group_size=5"):
        load("moe", preset="tiny", group_size=5)
    with pytest.raises(UserError, match="capacity_factor=0 must be a positive, finite number"):
        load("moe", preset="tiny", capacity_factor=0)
    # issue 47: inf reached math.ceil inside flax's scan, and the OverflowError blamed flax's axes_scan.py
    for bad in (float("inf"), float("nan"), True, "2"):
        with pytest.raises(UserError, match=rf"moe: capacity_factor={re.escape(repr(bad))} must be a positive, "
                                            r"finite number .*; 2 \(n_experts / top_k\) already drops no token"):
            load("moe", preset="tiny", capacity_factor=bad)
    wl = load("moe", preset="tiny", seq_len=64, group_size=16, capacity_factor=2.0)
    assert wl.batch["tokens"].shape == (4, 64) and wl.model.config.capacity_factor == 2.0


def test_tunix_llama_applies_its_annotations_and_activation_constraints():
    """tunix's Llama 3 as its trainer runs it (benchmarks/outside/tunix_llama.py, at a tiny size): its
    ('fsdp', 'tp') annotations placed as written, its shard() constraints applied under the mesh."""
    pytest.importorskip("tunix.models.llama3.model")
    from click.testing import CliRunner

    from jaxmem import cli

    wrapper = MODELS.parent / "benchmarks" / "outside" / "tunix_llama.py"
    r = CliRunner().invoke(cli.main, ["analyze", str(wrapper), "--arg", "size=tiny", "--arg", "seq_len=32", "--gpu",
                                      "h100", "--mesh", "fsdp=8,tp=1", "--json", "--no-explain"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    ac = d["activation_constraints"]
    assert ac["count"] > 0 and all("tunix/models/llama3/model.py" in a["at"] for a in ac["applied"])
    norms = 5 * 64   # 2 layers x 2 RMSNorms + the final one: ('tp',) in tunix's config, so whole on fsdp
    assert d["breakdown"]["params"] == 4 * (d["param_count"] - norms) // 8 + 4 * norms


def test_easydel_qwen3_analyzes_through_its_own_compute_loss_with_exact_parameter_bytes(monkeypatch):
    """EasyDeL's Qwen3 (benchmarks/outside/easydel_qwen3.py, at a tiny size): the model built and its
    own compute_loss called, the mesh in EasyDeL's axis names, the mesh EasyDeL builds for itself (from
    the backend its config records) the target's. EASYDEL_AUTO=0: on import EasyDeL otherwise appends
    an XLA flag this XLA does not know to XLA_FLAGS."""
    monkeypatch.setenv("EASYDEL_AUTO", "0")
    pytest.importorskip("easydel")
    from click.testing import CliRunner

    from jaxmem import cli

    wrapper = MODELS.parent / "benchmarks" / "outside" / "easydel_qwen3.py"
    r = CliRunner().invoke(cli.main, ["analyze", str(wrapper), "--arg", "size=tiny", "--arg", "seq_len=32", "--gpu",
                                      "h100", "--mesh", "dp=1,fsdp=8,ep=1,tp=1,sp=1", "--json", "--no-explain"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)   # qwix and EasyDeL warn on stderr
    n = d["param_count"]
    # embedding, 2 layers (q, k, v, o, gate/up/down, 2 norms, q/k norms), the final norm, and the lm_head
    # kernel EasyDeL's Qwen3ForCausalLM holds even with tied embeddings (the call uses the embedding's transpose)
    assert n == 256 * 64 + 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64 + 2 * 16) + 64 + 64 * 256
    assert d["breakdown"]["params"] == 2 * n // 8   # bf16, every leaf split over fsdp=8


def test_tunix_llama_with_qwix_lora_the_tunix_way_keeps_adamw_state_for_the_adapters_only():
    """tunix's Llama 3 with qwix LoRA applied as tunix's examples apply it (benchmarks/outside/tunix_llama.py
    --arg lora=16, at a tiny size): the nnx.LoRAParam leaves trained, their AdamW moments (+ the count) the
    whole optimizer state, placed by qwix's annotations (a factor whose sharded dim is tp=1 stays whole)."""
    pytest.importorskip("tunix.models.llama3.model")
    from click.testing import CliRunner

    from jaxmem import cli

    wrapper = MODELS.parent / "benchmarks" / "outside" / "tunix_llama.py"
    r = CliRunner().invoke(cli.main, ["analyze", str(wrapper), "--arg", "size=tiny", "--arg", "seq_len=32", "--arg",
                                      "lora=16", "--gpu", "h100", "--mesh", "fsdp=8,tp=1", "--json", "--no-explain"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)   # qwix and EasyDeL warn on stderr
    r_, dm, f, heads, kv, hd = 16, 64, 128, 4, 2, 16
    # per layer, (elements per device): q/k/v a (D, r) over fsdp, b (r, N, H) whole; o a (N, H, r) whole,
    # b (r, D) over fsdp; gate/up a (D, r) over fsdp, b (r, F) whole; down a (F, r) whole, b (r, D) over fsdp
    per_layer = ((dm * r_ // 8 + r_ * heads * hd) + 2 * (dm * r_ // 8 + r_ * kv * hd) + (heads * hd * r_ + r_ * dm // 8)
                 + 2 * (dm * r_ // 8 + r_ * f) + (f * r_ + r_ * dm // 8))
    assert d["trainable"]["source"] == "nnx.LoRAParam"
    assert d["trainable_param_count"] == 2 * (7 * dm * r_ + r_ * heads * hd + 2 * r_ * kv * hd + heads * hd * r_
                                              + 2 * r_ * f + f * r_)
    assert d["breakdown"]["optimizer_state"] == 2 * 4 * 2 * per_layer + 4   # mu and nu, fp32, 2 layers; the count
