"""jaxmem.truth.simulator: the strongest analytic baseline, term by term, on remat, FSDP, TP and ViT cases."""

import math

import pytest

from jaxmem.pipeline import AnalyzeOptions, analyze_file
from jaxmem.program.workload import load_workload
from jaxmem.truth import simulator
from jaxmem.truth.classic import TransformerDims

# GPT-2's shapes (dropout, a 4h GeLU MLP, as many K/V heads as heads): the case Korthikanti et al. wrote for
DIMS = TransformerDims(layers=1, heads=4, hidden=64, vocab=256, seq=64)
GPT_LAYER = simulator.LayerShape(ffn=256, gated=False, kv_heads=4, dropout=True, out_tokens=64)
B = 2
SBH = DIMS.seq * B * DIMS.hidden
AS2B = DIMS.heads * DIMS.seq ** 2 * B


def estimate(model, **kw):
    kw.setdefault("mesh", "data=1")
    kw.setdefault("layout", "dp")
    kw.setdefault("precision", "fp32")
    kw.setdefault("optimizer", None)
    kw.setdefault("remat", "none")
    wl = load_workload(model, remat=kw["remat"], preset="tiny", batch_size=kw.pop("batch_size", 8))
    return simulator.estimate(wl, **kw)


def test_a_gpt2_layer_is_korthikantis_34sbh_plus_5as2b_with_a_16_bit_softmax():
    layer = simulator.transformer_layer_bytes(DIMS, GPT_LAYER, B, t=1, c=2, softmax_bytes=2)
    assert layer["all"] == SBH * 34 + 5 * AS2B
    # tensor parallelism without sequence parallelism: sbh (10 + 24/t) + 5 as^2b / t
    layer = simulator.transformer_layer_bytes(DIMS, GPT_LAYER, B, t=2, c=2, softmax_bytes=2)
    assert layer["all"] == SBH * (10 + 24 / 2) + 5 * AS2B / 2


def test_an_fp32_softmax_costs_two_more_bytes_per_score():
    bf16_softmax = simulator.transformer_layer_bytes(DIMS, GPT_LAYER, B, 1, 2, softmax_bytes=2)["all"]
    fp32_softmax = simulator.transformer_layer_bytes(DIMS, GPT_LAYER, B, 1, 2, softmax_bytes=4)["all"]
    assert fp32_softmax - bf16_softmax == 2 * AS2B


def test_no_dropout_no_masks_and_swiglu_keeps_three_hidden_tensors():
    plain = simulator.LayerShape(ffn=256, gated=False, kv_heads=4, dropout=False, out_tokens=64)
    with_dropout = simulator.transformer_layer_bytes(DIMS, GPT_LAYER, B, 1, 2, 2)["all"]
    without = simulator.transformer_layer_bytes(DIMS, plain, B, 1, 2, 2)["all"]
    # 1-byte masks: attention probs + residual + MLP output; and the dropped-out probs (2 bytes)
    assert with_dropout - without == AS2B + 2 * AS2B + 2 * SBH
    gated = simulator.LayerShape(ffn=256, gated=True, kv_heads=4, dropout=False, out_tokens=64)
    assert (simulator.transformer_layer_bytes(DIMS, gated, B, 1, 2, 2)["all"] - without
            == 2 * DIMS.seq * B * 256)  # one more (s, b, ffn) tensor in bf16


def test_full_remat_keeps_layer_inputs_plus_one_layers_recompute_working_set(models_dir):
    none = estimate(models_dir / "gpt2.py", precision="bf16")
    full = estimate(models_dir / "gpt2.py", precision="bf16", remat="full")
    wl = load_workload(models_dir / "gpt2.py", preset="tiny")
    cfg = wl.model.config
    s, b, h, L = cfg.block_size, 8, cfg.n_embd, cfg.n_layer
    layer = none.terms["activations"] - 2 * 2 * s * b * h   # less the embedding output and final-norm input
    assert layer % L == 0
    one_layer = layer // L
    # L checkpointed inputs (bf16) + one layer's full activation set, live during its backward
    assert full.terms["activations"] == L * 2 * s * b * h + one_layer + 2 * 2 * s * b * h
    assert full.terms["activations"] < none.terms["activations"]
    # the rest of the estimate does not depend on remat
    assert {k: v for k, v in full.terms.items() if k != "activations"} == \
        {k: v for k, v in none.terms.items() if k != "activations"}


def test_state_is_sharded_per_zero_stage(models_dir):
    dp = estimate(models_dir / "gpt2.py", mesh="data=8", layout="dp")
    fsdp = estimate(models_dir / "gpt2.py", mesh="data=8", layout="fsdp")
    for term in ("params", "gradients", "optimizer_state"):
        assert fsdp.terms[term] == dp.terms[term] // 8
    stage1 = estimate(models_dir / "gpt2.py", mesh="data=8", layout="dp", zero_stage=1)
    stage2 = estimate(models_dir / "gpt2.py", mesh="data=8", layout="dp", zero_stage=2)
    assert stage1.terms["params"] == dp.terms["params"] and stage1.terms["gradients"] == dp.terms["gradients"]
    assert stage1.terms["optimizer_state"] == fsdp.terms["optimizer_state"]
    assert stage2.terms["gradients"] == fsdp.terms["gradients"] and stage2.terms["params"] == dp.terms["params"]
    # tensor parallelism splits all three by the model axis
    tp = estimate(models_dir / "gpt2.py", mesh="data=2,model=4", layout="tp")
    assert tp.terms["params"] == dp.terms["params"] // 4


def test_fsdp_counts_one_layers_gathered_weights_and_unreduced_gradient(models_dir):
    dp = estimate(models_dir / "gpt2.py", mesh="data=8", layout="dp", precision="bf16")
    fsdp = estimate(models_dir / "gpt2.py", mesh="data=8", layout="fsdp", precision="bf16")
    assert dp.terms["gathered_weights"] == 0
    cfg = load_workload(models_dir / "gpt2.py", preset="tiny").model.config
    h, v = cfg.n_embd, cfg.vocab_size
    layer = 4 * h * h + 2 * h * 4 * h                  # QKV + out projection + the 4h MLP
    # the larger of one layer and the tied embedding/head, gathered in bf16, plus its gradient before reduce-scatter
    assert fsdp.terms["gathered_weights"] == 2 * max(layer, v * h) * 2


def test_mixed_precision_adds_a_bf16_copy_and_pure_bf16_halves_the_state(models_dir):
    fp32 = estimate(models_dir / "gpt2.py")
    mixed = estimate(models_dir / "gpt2.py", precision="bf16")
    pure = estimate(models_dir / "gpt2.py", precision="bf16-pure")
    assert fp32.terms["param_copies"] == 0 and mixed.terms["param_copies"] == fp32.terms["params"] // 2
    assert mixed.terms["params"] == fp32.terms["params"]
    assert pure.terms["params"] * 2 == fp32.terms["params"]
    assert pure.terms["optimizer_state"] * 2 == pytest.approx(fp32.terms["optimizer_state"], rel=1e-3)


def test_vit_head_sees_one_token_per_image(models_dir):
    est = estimate(models_dir / "vit.py", precision="bf16", batch_size=8)
    cfg = load_workload(models_dir / "vit.py", preset="tiny").model.__closure__[0].cell_contents
    # bf16 logits + their fp32 copy for the loss + the fp32 gradient, for ONE token of each of 8 images
    assert est.terms["loss_logits"] == 8 * cfg.n_classes * (2 + 4 + 4)
    gpt = estimate(models_dir / "gpt2.py", precision="bf16", batch_size=8)
    gcfg = load_workload(models_dir / "gpt2.py", preset="tiny").model.config
    assert gpt.terms["loss_logits"] == 8 * gcfg.block_size * gcfg.vocab_size * (2 + 4 + 4)  # every token


def test_optimizer_state_follows_the_optimizer(models_dir):
    sizes = {opt: estimate(models_dir / "mlp.py", optimizer=opt).terms["optimizer_state"]
             for opt in ("sgd", "momentum", "adamw")}
    params = estimate(models_dir / "mlp.py").terms["params"]
    assert sizes["sgd"] < 64 and abs(sizes["momentum"] - params) < 64 and abs(sizes["adamw"] - 2 * params) < 64


def test_non_transformer_remat_keeps_block_outputs_and_one_blocks_recomputed_inner_outputs(models_dir):
    # mlp_nnx: each checkpointed Layer runs Linear -> BatchNorm -> Dropout (3 Flax layers)
    none = estimate(models_dir / "mlp_nnx.py", batch_size=64)
    full = estimate(models_dir / "mlp_nnx.py", batch_size=64, remat="full")
    assert "checkpointed blocks" in full.rule and "every layer's output" in none.rule
    assert 0 < full.terms["activations"] < none.terms["activations"]
    # mlp: one Dense per checkpointed Layer: nothing inside a block to recompute, so remat saves nothing
    assert (estimate(models_dir / "mlp.py", remat="full").terms["activations"]
            == estimate(models_dir / "mlp.py").terms["activations"])


def test_exact_state_terms_agree_with_jaxmems_analytic_state(models_dir):
    # the simulator's params / optimizer state are exact bytes (replicated here): the same as jaxmem's
    r = analyze_file(str(models_dir / "gpt2.py"), AnalyzeOptions(gpu="cpu", mesh="data=1", layout="dp",
                                                                   model_args=(("preset", "tiny"),), explain=False))
    est = estimate(models_dir / "gpt2.py", batch_size=r.options["batch"])
    assert est.terms["params"] == r.breakdown["params"]
    assert est.terms["optimizer_state"] == r.breakdown["optimizer_state"]
    assert est.terms["batch"] == r.breakdown["batch"]
    assert est.total_bytes == sum(est.terms.values()) and math.isfinite(est.total_bytes)
